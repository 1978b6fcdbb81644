"""Data: built-in tasks, prompt encoding, and the seeded prompt order."""
from verirl.data.tasks import TASKS, arith_split, reference_response
from verirl.data.prompts import encode_prompts, PromptSampler

__all__ = ["TASKS", "arith_split", "reference_response", "encode_prompts", "PromptSampler"]
