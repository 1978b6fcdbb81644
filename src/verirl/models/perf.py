"""The model's FLOPs per step (one formula behind perf/mfu and the benchmarks) and the device's
measured matmul peak (cached per device), with the device's name."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch


@dataclass(frozen=True)
class FlopModel:
    """The shape numbers of the formula above, for one model."""
    matmul_params: int  # N
    layers: int  # L
    hidden: int  # d

    @staticmethod
    def of(model) -> "FlopModel":
        """The nn.Linear weights, and a mixture-of-experts model's routers and the top-k experts a token
        visits in each sparse layer (its fused 3-D expert weights are no nn.Linear; the count is per expert,
        so it holds with the experts split over ranks)."""
        from verirl.models.moe import moe_blocks, routing

        n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        r = routing(model.config)
        for _, block in moe_blocks(model) if r is not None else ():
            experts, gate = block.experts, block.gate
            n += r.top_k * (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel())
            n += 0 if isinstance(gate, torch.nn.Linear) else gate.weight.numel()
        cfg = getattr(model.config, "text_config", None) or model.config
        layers = next(getattr(cfg, k) for k in ("num_hidden_layers", "n_layer", "num_layers") if hasattr(cfg, k))
        hidden = next(getattr(cfg, k) for k in ("hidden_size", "n_embd", "d_model") if hasattr(cfg, k))
        return FlopModel(int(n), int(layers), int(hidden))

    def forward(self, tokens: float, keys: float) -> float:
        """FLOPs of a forward over ``tokens`` tokens that attend ``keys`` keys in all."""
        return 2.0 * self.matmul_params * tokens + 4.0 * self.layers * self.hidden * keys


def prompt_cost(p: int) -> tuple[int, int]:
    """(tokens, attended keys) of a causal forward over a prompt of p tokens."""
    return p, p * (p + 1) // 2


def response_cost(p: int, r: int) -> tuple[int, int]:
    """(tokens, keys) of a forward over r response tokens after p prompt tokens (teacher-forced)."""
    return r, r * p + r * (r + 1) // 2


def decode_cost(p: int, r: int) -> tuple[int, int]:
    """(tokens, keys) of generating r tokens after a prefilled prompt of p: r - 1 one-token forwards
    (the prefill's logits give the first token; the last token is never fed back), the one at
    position p + t - 1 attending p + t keys."""
    steps = max(r - 1, 0)
    return steps, steps * p + steps * (steps + 1) // 2


def step_flops(fm: FlopModel, prompt_lengths: list[int], response_lengths: list[int], group_size: int,
               logprob_passes: int, update_passes: int, share_prompt: bool) -> dict[str, float]:
    """Model FLOPs of one step over the given responses (the samples of a prompt contiguous, ``group_size``
    each): ``rollout`` (each prompt prefilled once, then one token per decoding row-step),
    ``logprob`` (each no-grad pass: old log-probs, reference; a prompt once per group with
    ``share_prompt``), ``update`` (forward + backward, 3x a forward, per epoch)."""
    roll = lp = 0.0
    for g in range(0, len(response_lengths), group_size):
        p = int(prompt_lengths[g])
        roll += fm.forward(*prompt_cost(p))
        pass_ = fm.forward(*prompt_cost(p)) * (1 if share_prompt else group_size)
        for r in response_lengths[g:g + group_size]:
            roll += fm.forward(*decode_cost(p, int(r)))
            pass_ += fm.forward(*response_cost(p, int(r)))
        lp += pass_
    return {"rollout": roll, "logprob": lp * logprob_passes, "update": 3.0 * lp * update_passes}


def mfu(flops: float, seconds: float, world_size: int, peak_flops: float) -> float:
    """perf/mfu: achieved model FLOPs / (seconds x world size x peak FLOP/s of one device)."""
    return flops / max(seconds * world_size * peak_flops, 1e-30)


def measure_peak_flops(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 0,
                       repeats: int = 5) -> float:
    """The device's matmul rate, FLOP/s: the best of ``repeats`` (size x size) @ (size x size)
    products in ``dtype`` (one warm-up first; size 2048 on a CPU, the faster of torch.mm and oneDNN:
    `cpu_matmul_rates`). On an accelerator, 8192 and 20
    products timed back to back between two synchronisations, so that launches and the sync do not
    count. The denominator of perf/mfu when trainer.peak_flops is 0, cached per device, dtype and
    thread count (`peak_flops`)."""
    accel = device.type != "cpu"
    size = size or (8192 if accel else 2048)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    if not accel:
        return max(cpu_matmul_rates(a, b, repeats).values())  # each library warmed up there
    sync = getattr(torch, device.type).synchronize
    a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    sync()
    return 2.0 * size ** 3 * 20 / (time.perf_counter() - t0)


def cpu_matmul_rates(a: torch.Tensor, b: torch.Tensor, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of ``a @ b`` on the CPU through each library verirl multiplies with: torch.mm (MKL on
    x86), and oneDNN with a laid-out weight for float32 (verirl.core.ops.linear). Best of ``repeats``
    after a warm-up. The two differ by up to 1.5x on AMD processors, where MKL takes a generic path:
    the peak behind perf/mfu is the faster."""
    from verirl.core.ops.linear import onednn_available

    runs = {"torch.mm": lambda: a @ b}
    if a.dtype == torch.float32 and onednn_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)
        runs["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    rates = {}
    for name, run in runs.items():
        run()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t0)
        rates[name] = 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best
    return rates


def _cpuinfo(text: str) -> dict[str, str]:
    """The first processor's fields of a /proc/cpuinfo text."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def device_name(device: torch.device, cpuinfo: Optional[str] = None) -> str:
    """What the device is, precisely enough to tell two machines' matmul peaks apart: a GPU's name; for
    the CPU its model name with family and model numbers (a virtual machine may call a Zen 3 and a Zen 4
    both "AMD EPYC"; an Arm core has no model name, its implementer and part numbers say it) and the
    instruction set torch's kernels use (AVX2, AVX512, ...). ``cpuinfo``: the text of /proc/cpuinfo
    (read here when None; on other systems, platform's processor name)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    info = _cpuinfo(cpuinfo)
    name = info.get("model name") or platform.processor() or platform.machine() or "cpu"
    ids = [f"{k} {info[k]}" for k in ("cpu family", "model", "CPU implementer", "CPU part") if info.get(k)]
    return f"{name} ({', '.join([*ids, torch.backends.cpu.get_cpu_capability()])})"


def peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """`measure_peak_flops`, measured once per (device name, dtype, threads) and kept in
    $VERIRL_CACHE/peak_flops.json."""
    from verirl.core.cache import cache_root

    # earlier entries (a CPU named by its architecture alone, "cpu:x86_64"; torch.mm alone) are left unread
    key = f"{device.type}:{device_name(device)}|{dtype}|threads={torch.get_num_threads()}|mm+onednn"
    path = cache_root() / "peak_flops.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = measure_peak_flops(device, dtype)
        try:  # written whole (a temporary file renamed): another process never reads half a file
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1))
            os.replace(tmp, path)
        except OSError:  # a read-only cache: measured again next time
            pass
    return float(known[key])
