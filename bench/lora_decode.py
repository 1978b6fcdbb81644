"""LoRA in the native engine: merge the adapters into the decoder's weights once per generate call, or
apply them at every decoding step?

The native engine's lean decoder reads each layer's weights and lays them out once per generate call;
with LoRA it lays out W + scale x B A (`verirl.models.lora.merged_weight`), so each decoding step costs
what it costs without adapters. The alternative applies the adapters in the step: two more thin
products per adapted layer and token, which is what the model's own forward through peft's layers does
(the engine's fallback for models the lean decoder does not support). Measured here, same prompts,
same seeds:

  base   the model without adapters, lean decoder
  merged LoRA (rank r on every linear layer), lean decoder with merged weights (verirl's way)
  peft   LoRA, the model's own forward through peft's layers (adapters applied at every step)

    .venv/bin/python bench/lora_decode.py                       # tiny and a SmolLM2-135M-shaped model
    .venv/bin/python bench/lora_decode.py --models tiny --rank 16
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(name: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    from verirl.core.ops.linear import use_fast_linears
    from verirl.models import load_model

    if name == "tiny":
        return load_model("tiny").model
    config = AutoConfig.for_model("llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                  num_attention_heads=8, num_key_value_heads=4, vocab_size=49152,
                                  tie_word_embeddings=True, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    use_fast_linears(model)
    return model


def timed(engine, prompts, params, repeats: int) -> float:
    engine.generate(prompts, 1, params, prompt_index=list(range(len(prompts))))  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        engine.generate(prompts, 1, params, prompt_index=list(range(len(prompts))))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,smollm2-shape")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import verirl.rollout.native as native
    from verirl.models.lora import LoraSettings, apply_lora
    from verirl.rollout import NativeEngine, SamplingParams

    params = SamplingParams(args.tokens, 1.0, 1.0, 0, seed=0)
    for name in args.models.split(","):
        model = build(name)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, model.config.vocab_size, (24,), generator=g).tolist() for _ in range(args.rows)]
        engine = NativeEngine(model, 0, [2])
        base = timed(engine, prompts, params, args.repeats)
        apply_lora(model, LoraSettings(args.rank, 2.0 * args.rank))
        with torch.no_grad():  # B off zero, as after training (the cost does not depend on the values)
            for k, p in model.named_parameters():
                if ".lora_B." in k:
                    p.normal_(0, 0.01)
        merged = timed(engine, prompts, params, args.repeats)
        lean = native.lean_supported
        native.lean_supported = lambda m: False  # the model's own forward, through peft's layers
        try:
            peft = timed(engine, prompts, params, args.repeats)
        finally:
            native.lean_supported = lean
        t = time.perf_counter()
        from verirl.rollout.lean import LeanDecoder

        LeanDecoder(model)
        pack = time.perf_counter() - t
        tokens = args.rows * args.tokens
        print(f"{name}: rank {args.rank}, {args.rows} rows x {args.tokens} tokens; tokens/s base {tokens / base:,.0f}, "
              f"merged {tokens / merged:,.0f} ({base / merged:.2f}x base), peft {tokens / peft:,.0f} "
              f"({peft / merged:.2f}x merged's time); laying out the merged weights {pack * 1e3:.1f} ms a call")


if __name__ == "__main__":
    main()
