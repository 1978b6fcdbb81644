"""Kernels: faster ways to compute the same numbers, used by the passes and the decoder.

Nothing here is GRPO maths; that lives in `verirl.core.algo`.
"""
