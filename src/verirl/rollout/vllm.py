"""vLLM as the rollout engine, inside the training process (docs/vllm.md).

* vLLM's offline ``LLM`` runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and
  its one worker live in this process), so the weight push below hands vLLM live tensors, not copies
  through a socket.
* Prompts go in as token ids (``TokensPrompt``). Every sample is its own request (``n=1``) with a seed
  derived from (the step's seed, the prompt's global position, the sample index): sample j of the
  prompt at global position g is the same whatever else is in the call (the chunking, the rank's
  share), as with the native engine. vLLM's sampler is not the native engine's inverse-CDF Philox
  sampler, so the SAMPLED tokens differ from the native engine's for the same seed; only greedy output
  (temperature 0) matches it.
* Stops: ``ignore_eos=True`` plus ``stop_token_ids=stop_ids``: exactly verirl's stop ids end a response
  (every one of them, and not some other EOS vLLM reads from generation_config.json), and the stop
  token is in the returned ids; ``build_rollout`` masks by position.
* Log-probs: ``logprobs=0`` (the sampled token's only) with ``logprobs_mode="processed_logprobs"``:
  log-softmax of the logits after temperature AND after top-k/top-p masking, i.e. of the distribution
  the token was drawn from. With top_k=0 and top_p=1 (the defaults) that is exactly the trainer's
  log-softmax(logits / T) over the whole vocabulary. With truncation on, vLLM's value is renormalised
  over the kept tokens (it is larger by -log(kept mass)); vLLM 0.32 has no mode "after temperature,
  before truncation" (its modes: raw_logprobs, raw_logits, processed_logprobs, processed_logits), so
  ``rollout/logprob_diff`` then also measures the truncation, not only a stale push.
* Weight push (``sync_weights``): the live parameters, one tensor at a time (made whole by the
  ``whole`` the trainer passes in, `verirl.train.pipelined.push_tensor`: sent over the pipeline by the
  stage that holds it, gathered over FSDP2's and tensor parallelism's shards; vLLM's loaders cut it
  again for the engine's own tensor parallelism; ``perf/push_peak_gb``: the largest one), streamed
  as an iterator of (HF name, tensor) into the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` through
  ``LLM.collective_rpc``. That is vLLM's in-place reload: it restores each layer to checkpoint format,
  runs the model's ``load_weights`` (HF -> vLLM names, q/k/v and gate/up fusion) and then the layer's
  ``process_weights_after_loading`` again (the CPU backend's repacking of linear weights), copying the
  result into the tensors the engine already holds. A plain ``model.load_weights`` into a live CPU
  engine fails (``'Parameter' object has no attribute 'weight_loader'``) because the repacked
  parameters have lost their loaders; this route works on CPU and GPU alike (no file round-trip).
* Push check (``check_push``, after every push): the engine's weights as it computes with them,
  compared tensor by tensor with the trainer's, in vLLM's layout: HF tensors fused as the model's
  ``packed_modules_mapping`` says (q/k/v -> qkv_proj, gate/up -> gate_up_proj), cast to the engine's
  dtype as the load casts them, padded rows (vocabulary) left out. A tensor the engine still holds is
  read directly; a linear layer the CPU backend repacked (its weight emptied, a GEMM handle
  ``cpu_linear`` in its place, the LM head's handle included) is read through that handle on one-hot
  inputs, which returns its weight's columns exactly in any dtype: every column up to
  ``PROBE_COLUMNS`` inputs, else that many, drawn anew each push. A good push differs by 0.0 whatever
  the trainer's compute dtype; ``rollout/push_max_abs_diff`` logs the worst difference and a push
  over ``PUSH_TOLERANCE`` (times the tensor's largest value) raises, naming the tensors. With
  tensor_parallel_size > 1 (each rank holds shards) there is no check; ``rollout/logprob_diff`` remains.
* Several ranks (docs/vllm.md): ``distributed_executor_backend="external_launcher"``: vLLM joins the
  launcher's already-initialised process group instead of making its own, and lays it out as
  (world / tp independent engines) x (tp consecutive ranks each). tp = 1: an engine per rank on the
  rank's prompts; tp > 1: the group's ranks gather their prompts and all submit the same list (vLLM's
  external launcher relies on identical requests), each keeps its own rows.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
from typing import Callable, Iterator, Optional, Sequence

import torch

from verirl.core.dtensors import local
from verirl.models.lora import is_lora
from verirl.rollout.base import SamplingParams, build_rollout, left_pad
from verirl.rollout.vllm_lora import AdapterPush, engine_adapters, engine_name, engine_rank, packed_modules
from verirl.core.types import Rollout

# Test hook: a regex; parameters whose HF name matches it are NOT pushed (the engine keeps its old
# values for them). Only for the tests that show a failed push is caught (the push check, rollout/logprob_diff).
SKIP_ENV = "VERIRL_VLLM_PUSH_SKIP"

PROBE_COLUMNS = 512  # input columns of a repacked linear layer read per push (all of them when it has fewer)
PUSH_TOLERANCE = 1e-6  # the largest |engine - trainer| a push may leave, times the tensor's largest |value|

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": "auto"}


def request_seed(seed: int, prompt_position: int, sample: int, offset: int = 0) -> int:
    """The vLLM request seed of sample ``sample`` of the prompt at global position ``prompt_position``
    (63 bits of a hash of the three): independent of batching, ranks and chunking. ``offset``: the response
    position a multi-turn episode's later turn starts at (0: the first turn, the single-turn seed)."""
    key = f"verirl-vllm:{int(seed)}:{int(prompt_position)}:{int(sample)}" + (f":{int(offset)}" if offset else "")
    h = hashlib.blake2b(key.encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def _world() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) when there is none."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def _set_cpu_env() -> None:
    """Environment vLLM reads when it starts (set only where the user has not): in-process engine
    core; on CPU a small explicit KV cache (GiB) instead of a share of the host's memory, and the
    OpenMP threads bound to this process's CPUs."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}-{cpus[-1]}" if cpus == list(
            range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus)))


def _refresh_cpu_lm_head(worker) -> int:
    """(Runs in the vLLM worker.) The CPU backend's vocabulary layers keep their weight AND a GEMM
    handle built from it (``dispatch_cpu_unquantized_gemm(remove_weight=False)``). With tied embeddings
    vLLM's ``load_weights`` skips ``lm_head.weight``, so the in-place reload updates the shared weight but
    never rebuilds the LM head's handle: the logits stay those of the old embeddings. Rebuild it."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    done = 0
    for module in worker.model_runner.get_model().modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear") \
                and module.weight.numel() and not module.weight.is_meta:
            module.quant_method.process_weights_after_loading(module)
            done += 1
    return done


def _refresh_cpu_experts(worker) -> int:
    """(Runs in the vLLM worker.) The CPU backend computes a mixture-of-experts layer on its experts prepacked
    into its grouped-GEMM layout (``CPUUnquantizedExperts.process_weights_after_loading``). vllm-cpu 0.32 runs
    that step only when the layer's kernel is first built (``UnquantizedFusedMoEMethod._setup_kernel`` skips it
    on a weight update), so after the in-place reload ``w13_weight`` / ``w2_weight`` are left unpacked and the
    layer computes with scrambled experts (log-probs off by several nats). Prepack what was loaded."""
    done = 0
    for module in worker.model_runner.get_model().modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight") and type(experts).__name__.startswith("CPU"):
            experts.process_weights_after_loading(module)
            done += 1
    return done


def _engine_weights(worker, columns: int, draw: int) -> tuple[dict, dict, dict, torch.dtype]:
    """(Runs in the vLLM worker.) -> (name -> the engine's tensor as it computes with it, name -> the
    input columns read through a GEMM handle when not all of them, the model's ``packed_modules_mapping``,
    its dtype). A weight behind a handle (``cpu_linear``) is the handle's output on one-hot inputs without
    bias: (out features, columns), exact; CPU experts prepacked for the grouped GEMM are named with their ISA
    instead of columns (the trainer's tensor is prepacked the same way to compare). Tensors are the engine's own, not copies (in-process engine)."""
    model = worker.model_runner.get_model()
    tensors, probed = {}, {}
    with torch.no_grad():
        for prefix, module in model.named_modules():
            experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
            if experts is not None and type(experts).__name__.startswith("CPU") and hasattr(experts, "isa"):
                for short in ("w13_weight", "w2_weight"):  # prepacked (`_refresh_cpu_experts`): compared prepacked
                    probed[f"{prefix}.{short}"] = str(experts.isa)
            for short, p in module.named_parameters(recurse=False):
                name = f"{prefix}.{short}" if prefix else short
                if short != "weight" or not hasattr(module, "cpu_linear"):
                    tensors[name] = p.data
                    continue
                # a weight emptied by the repack: its input width (ReplicatedLinear, e.g. a MoE router's
                # GateLinear, has no per-partition width: it is not split)
                k = p.shape[1] if p.dim() == 2 else int(getattr(module, "input_size_per_partition", module.input_size))
                if k <= columns:  # every column: the identity's product is the whole weight
                    tensors[name] = module.cpu_linear(torch.eye(k, dtype=p.dtype, device=p.device), p, None).T
                    continue
                cols = torch.randperm(k, generator=torch.Generator().manual_seed(draw))[:columns].sort().values
                x = torch.zeros(len(cols), k, dtype=p.dtype, device=p.device)
                x[torch.arange(len(cols)), cols.to(p.device)] = 1
                tensors[name], probed[name] = module.cpu_linear(x, p, None).T, cols
    return tensors, probed, packed_modules(model), worker.model_config.dtype


def _trainer_tensors(model, packed: dict, full: Callable) -> Iterator[tuple[str, str, Optional[torch.Tensor]]]:
    """(engine name, HF name, the trainer's whole tensor in the engine's layout, in its own dtype) for each tensor of
    ``model``, fused members concatenated when the last of them arrives; a fused tensor whose members do not
    all exist comes last, with None. ``full`` makes each tensor whole (under FSDP2 a gather: a collective)."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        target, member = engine_name(name, packed)
        whole = full(t).detach()
        if not member:
            yield target, name, whole
            continue
        fused = next(m for m in packed.values() if member in m)
        parts = groups.setdefault(target, {})
        parts[member] = whole
        if len(parts) == len(fused):
            del groups[target]
            yield target, name, torch.cat([parts[m] for m in fused])
    for target in groups:
        yield target, target, None


def _difference(engine: torch.Tensor, ref: torch.Tensor, cols) -> Optional[tuple[float, float]]:
    """(max |engine - ref|, max |ref|), rows past ``ref``'s being the engine's padding; None when the
    layouts do not match."""
    if cols is not None:
        ref = ref[:, cols.to(ref.device)]
    if engine.dim() != ref.dim() or engine.shape[1:] != ref.shape[1:] or engine.shape[0] < ref.shape[0]:
        return None
    if not ref.numel():
        return 0.0, 0.0
    a, b = engine[:ref.shape[0]].float(), ref.to(engine.device).float()
    return float((a - b).abs().max()), float(b.abs().max())


_FUSED_EXPERTS = re.compile(r"(.*\.experts)\.(gate_up_proj|down_proj)$")
_ONE_EXPERT = re.compile(r"\.\d+\.[^.]+\.weight$")


def _engine_target(target: str, saved: list[str], engine: dict) -> str:
    """The engine's name for a trainer tensor (``target``: its name with vLLM's packed projections; ``saved``:
    the checkpoint names `saved_format` gives it). A tensor the checkpoint renames is the engine's under that
    name (Mixtral's router: ``block_sparse_moe.gate``); transformers' fused experts are vLLM's FusedMoE
    ``w13_weight`` (E, 2I, H: w1 = gate, w3 = up) and ``w2_weight`` (E, H, I), the same layout, in the module
    the checkpoint names the experts' (``mlp.experts``, Mixtral's ``block_sparse_moe.experts``), under
    ``routed_experts`` or directly."""
    if target in engine:
        return target
    if len(saved) == 1 and saved[0] in engine:
        return saved[0]
    m = _FUSED_EXPERTS.match(target)
    if m is None:
        return target
    base = _ONE_EXPERT.sub("", saved[0]) if saved and _ONE_EXPERT.search(saved[0]) else m.group(1)
    leaf = "w13_weight" if m.group(2) == "gate_up_proj" else "w2_weight"
    return next((n for n in (f"{base}.routed_experts.{leaf}", f"{base}.{leaf}") if n in engine), target)


def _guard_shutdown(llm) -> None:
    """vLLM's in-process engine shuts itself down from a finalizer (at the latest at interpreter exit),
    destroying the process groups it built on the launcher's default group. If that group has already
    been destroyed (verirl's ``distributed.close`` at the end of a run, when nobody called
    ``VLLMEngine.close`` first), torch raises "Invalid process group specified" in that finalizer. Keep
    vLLM's finalizer but skip the process-group teardown when there is no default group left: those
    groups went with it."""
    import weakref

    client = llm.llm_engine.engine_core  # InprocClient (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is None or finalizer.detach() is None:
        return
    client._finalizer = weakref.finalize(client, _shutdown_core, client.engine_core)


def _shutdown_core(core) -> None:
    if torch.distributed.is_initialized():
        core.shutdown()
        return
    from vllm.distributed import parallel_state

    for name in ("_TP", "_ETP", "_ENGRAM_DP", "_DCP", "_PCP", "_PP", "_DP", "_EP", "_EPLB", "_INNER_DP_WORLD",
                 "_WORLD"):
        if hasattr(parallel_state, name):
            setattr(parallel_state, name, None)  # destroyed with the default group; do not destroy them again
    core.shutdown()


class VLLMEngine:
    """The ``vllm`` rollout engine (see the module docstring and docs/vllm.md).

    ``push_skip``: a regex of HF parameter names NOT to push (a test hook that makes a push fail on
    purpose; also read from the environment variable ``VERIRL_VLLM_PUSH_SKIP``). Never set it in a run."""

    reads_live_model = False  # generate never reads the trainer's parameters (no need to unshard them for it)

    def __init__(self, model, pad_id: int, stop_ids: Sequence[int], *, path: str, tokenizer=None,
                 dtype: str = "float32", override_config: Optional[dict] = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, max_num_seqs: int = 256, max_num_batched_tokens: int = 0,
                 enable_chunked_prefill: bool = True, enforce_eager: bool = True, free_cache_engine: bool = True,
                 max_model_len: int = 0, seed: int = 0, push_skip: Optional[str] = None,
                 whole: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, lora_rank: int = 0):
        world, rank = _world()
        tp = int(tensor_parallel_size)
        if tp < 1 or world % tp:
            raise ValueError(f"rollout.tensor_parallel_size={tp} must divide the {world} ranks (consecutive ranks "
                             f"form one engine's tensor-parallel group)")
        if world == 1 and tp > 1:
            raise NotImplementedError(
                "rollout.tensor_parallel_size > 1 needs as many ranks (trainer.nproc_per_node): each rank holds "
                "one tensor-parallel shard of its group's engine (docs/vllm.md)")
        self.world, self.rank, self.tp = world, rank, tp
        _set_cpu_env()
        try:
            import vllm  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("rollout.engine=vllm needs vLLM: pip install 'verirl[vllm]' (on CPU: make test-vllm "
                              "builds .venv-vllm; see docs/vllm.md)") from e
        from vllm import LLM
        from vllm.platforms import current_platform

        from verirl.models.load import resolve_path

        if enable_chunked_prefill and current_platform.is_cpu():
            # vLLM's CPU runner rewinds a seeded request's generator after a partial prefill, which a CPU
            # generator cannot do ("RuntimeError: CPU Generator does not use offset", vllm-cpu 0.32: any
            # step whose prompts exceed max_num_batched_tokens). Prompts therefore go in whole on a CPU.
            print("rollout.engine=vllm on a CPU: enable_chunked_prefill off (vLLM's CPU sampler fails on a seeded "
                  "request whose prompt is split across scheduler steps)")
            enable_chunked_prefill = False
        self.model, self.pad_id, self.stop_ids = model, pad_id, list(stop_ids)
        self.push_skip = push_skip if push_skip is not None else (os.environ.get(SKIP_ENV) or None)
        self.sleep_supported = bool(current_platform.is_sleep_mode_available())
        self.free_cache_engine = bool(free_cache_engine) and self.sleep_supported
        self.asleep = False
        self.held = False  # inside `awake`: the engine stays awake between calls (a multi-turn rollout's turns)
        kwargs = dict(model=resolve_path(path), dtype=_DTYPES.get(dtype, dtype), seed=int(seed),
                      tensor_parallel_size=int(tensor_parallel_size),
                      gpu_memory_utilization=float(gpu_memory_utilization), enforce_eager=bool(enforce_eager),
                      enable_chunked_prefill=bool(enable_chunked_prefill),
                      logprobs_mode="processed_logprobs", skip_tokenizer_init=True,
                      enable_sleep_mode=self.free_cache_engine,
                      # a multi-turn episode's every turn is sent as its whole token prefix (prompt, turns,
                      # observations): cached, only the new observation tokens are prefilled. vLLM's default
                      # for decoder models, said here so a changed default cannot turn it off
                      enable_prefix_caching=True)
        if max_num_seqs:
            kwargs["max_num_seqs"] = int(max_num_seqs)
        if max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = int(max_num_batched_tokens)
        if max_model_len:
            kwargs["max_model_len"] = int(max_model_len)
        if override_config:
            kwargs["hf_overrides"] = dict(override_config)
        if lora_rank and current_platform.is_cpu():
            from verirl.core.errors import ConfigError
            from verirl.models.moe import routing

            if routing(model.config) is not None:
                raise ConfigError(
                    f"actor.lora.rank={lora_rank} with rollout.engine=vllm on a CPU and a mixture-of-experts model "
                    f"({path}): with LoRA on, vLLM computes the experts through its LoRA MoE layer, whose kernels "
                    f"are Triton's, which vllm-cpu lacks (measured on vllm-cpu 0.32: \"module 'triton.language' has "
                    f"no attribute 'float32'\" in the first generate). Use rollout.engine=native, or vLLM on a GPU.")
        if lora_rank:  # a LoRA run: the base from model.path, the adapters pushed (`verirl.rollout.vllm_lora`)
            kwargs.update(enable_lora=True, max_lora_rank=engine_rank(lora_rank), max_loras=1)
        if world > 1:
            # one engine per group of tp consecutive ranks, inside the launcher's process group (docs/vllm.md):
            # vLLM's "external_launcher" executor runs the one worker in this process with RANK / LOCAL_RANK
            # from the environment and, finding torch.distributed initialised, builds its world and its
            # tensor-parallel groups from the existing default group (world / tp independent engines).
            for key in ("RANK", "LOCAL_RANK"):
                if key not in os.environ:
                    raise RuntimeError(f"rollout.engine=vllm with {world} ranks needs {key} in the environment "
                                       f"(set by torch's launcher / torchrun)")
            kwargs["distributed_executor_backend"] = "external_launcher"
        if not self.sleep_supported:
            # the CPU backend's share is of the HOST's memory and is checked against what is free; the KV
            # cache size comes from VLLM_CPU_KVCACHE_SPACE instead (set above)
            kwargs["gpu_memory_utilization"] = min(kwargs["gpu_memory_utilization"], 0.1)
        self.llm = LLM(**kwargs)
        if world > 1:
            _guard_shutdown(self.llm)
        # a trainer tensor made whole for the push (the training strategy's gather; as it is when unsharded)
        self.whole = whole or (lambda t: t)
        self.pushes = 0  # weight pushes done (sync_weights calls)
        self.unchecked: list[str] = []  # trainer tensors the push check found no engine counterpart for
        self.last_push: list[str] = []  # the names pushed by the last sync_weights
        self.last_skipped: list[str] = []  # the names the test hook kept back
        self.made_bytes = 0  # the largest tensor the last push assembled (gathered or sent) for vLLM
        self.adapters = AdapterPush(str(path), self.push_skip) if lora_rank else None  # a LoRA run's push
        self.lora_request = None  # the adapters every request carries, once pushed

    def close(self) -> None:
        """Shut the engine down. With several ranks call it BEFORE the launcher's process group is
        destroyed: vLLM's shutdown destroys its own groups (built on that default group) and then the
        default group itself. Idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        if getattr(self, "adapters", None) is not None:
            self.adapters.close()

    # -- weights ---------------------------------------------------------------------------------
    def _weights(self, model) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, whole tensor) for every parameter and persistent buffer, one at a time: under FSDP2
        each is gathered just before vLLM consumes it (``strategy.full``: a collective, called for the
        same tensors in the same order on every rank, skipped ones included). Tied tensors once; a
        tensor under the names a checkpoint gives it, which is what vLLM's ``load_weights`` maps (`saved_format`:
        a mixture-of-experts model's fused experts as each expert's matrices, views of the fused tensor; vLLM
        loads a fused 3-D tensor under the model's own name into nothing it computes with)."""
        full, saved = self.whole, self._saved_format(model)
        skip = re.compile(self.push_skip) if self.push_skip else None
        seen: set[int] = set()
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in seen:
                continue
            seen.add(id(t))
            whole = full(t).detach()
            if whole.numel() and whole.data_ptr() != local(t).data_ptr():  # assembled for the push
                self.made_bytes = max(self.made_bytes, whole.numel() * whole.element_size())
            if skip is not None and skip.search(name):
                self.last_skipped.append(name)
                continue
            self.last_push.append(name)
            yield from saved(name, whole).items()

    def _saved_format(self, model) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
        """`verirl.models.load.saved_format` of ``model``'s config, built once (on the meta device)."""
        if getattr(self, "_saved", None) is None:
            from verirl.models.load import saved_format

            self._saved = saved_format(model.config)
        return self._saved

    @torch.no_grad()
    def sync_weights(self, model) -> dict[str, float]:
        """Push ``model``'s current weights into the engine (vLLM's in-place ``reload_weights``) and check
        them (`check_push`); -> ``{"rollout/push_max_abs_diff": ...}`` (empty with tensor_parallel_size > 1)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # weights back on the device; the KV cache stays freed
        if self.adapters is not None and is_lora(model):
            return self._sync_adapters(model)
        self.last_push, self.last_skipped, self.made_bytes = [], [], 0
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        self.llm.collective_rpc("reload_weights",
                                kwargs=dict(weights_iterator=self._weights(model), is_checkpoint_format=True))
        # perf/push_peak_gb: the device memory the push took beyond what was held before it (on a GPU,
        # measured); on a CPU, the largest tensor assembled for it (one at a time: the rest are the trainer's)
        peak = (torch.cuda.max_memory_allocated() - base) if cuda else self.made_bytes
        if not cuda:
            self.llm.collective_rpc(_refresh_cpu_lm_head)
            self.llm.collective_rpc(_refresh_cpu_experts)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.pushes += 1
        out = {"perf/push_peak_gb": peak / 2**30}
        if self.tp > 1:
            return out
        return {**out, "rollout/push_max_abs_diff": self.check_push(model)}

    def _sync_adapters(self, model) -> dict[str, float]:
        """A LoRA run's push: its adapters written for vLLM and reloaded in place, then read back and
        checked (`verirl.rollout.vllm_lora`); the base weights stay the ones vLLM loaded."""
        self.lora_request = self.adapters.request(self.adapters.write(model, self.whole))
        self.llm.llm_engine.add_lora(self.lora_request)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old adapters
        self.pushes += 1
        out = {"perf/push_peak_gb": self.adapters.largest / 2**30}
        if self.tp > 1:  # vLLM holds its tensor-parallel share of each adapter
            return out
        engine, packed = self.llm.collective_rpc(engine_adapters)[0]
        return {**out, "rollout/push_max_abs_diff": self.adapters.check(engine, packed, model, self.whole,
                                                                         PUSH_TOLERANCE)}

    def check_push(self, model, columns: int = PROBE_COLUMNS) -> float:
        """The largest |engine - trainer| over ``model``'s weights (0.0 after a good push, whatever the
        trainer computes in); a tensor off by more than `PUSH_TOLERANCE` times its largest |value| is a
        RuntimeError naming the tensors. ``columns``: the inputs of a repacked layer read (all when it has
        no more). Every rank calls it (``strategy.full`` gathers shards)."""
        engine, probed, packed, dtype = self.llm.collective_rpc(_engine_weights, args=(columns, self.pushes))[0]
        worst, bad, unchecked = 0.0, [], []
        saved = self._saved_format(model)
        for target, name, whole in _trainer_tensors(model, packed, self.whole):
            target = _engine_target(target, [] if whole is None else list(saved(name, whole)), engine)
            cols = probed.get(target)
            if isinstance(cols, str) and whole is not None and target in engine:  # CPU experts, prepacked
                from vllm._custom_ops import cpu_prepack_moe_weight

                whole, cols = cpu_prepack_moe_weight(whole.to(engine[target].dtype).contiguous(), cols), None
            # in the dtype the engine holds this tensor in: vLLM's CPU backend keeps some (a bias on a CPU with
            # AMX) in float32 beside bfloat16 weights
            diff = None if whole is None or target not in engine else \
                _difference(engine[target], whole.to(engine[target].dtype), cols)
            if diff is None:
                unchecked.append(name)
                continue
            worst = max(worst, diff[0])
            if diff[0] > PUSH_TOLERANCE * diff[1]:
                bad.append(f"{target} (by {diff[0]:.3g}, values up to {diff[1]:.3g})")
        if unchecked and unchecked != self.unchecked:
            more = ", ..." if len(unchecked) > 4 else ""
            print(f"rollout.engine=vllm: the push check finds no engine tensor of the same layout for "
                  f"{len(unchecked)} trainer tensors ({', '.join(unchecked[:4])}{more}); they are not checked")
        self.unchecked = unchecked
        if bad:
            raise RuntimeError(
                f"the weight push into vLLM failed: {len(bad)} tensors in the engine differ from the trainer's "
                f"(max |difference|): {', '.join(bad[:8])}{', ...' if len(bad) > 8 else ''}. The "
                f"engine would sample from other weights than the ones being trained. Push number "
                f"{self.pushes}, engine dtype {str(dtype).removeprefix('torch.')}.")
        return worst

    def _group_prompts(self, mine: list, index: list, n: int, params: SamplingParams):
        """(every rank's prompts of this tensor-parallel group in rank order, their global positions, where
        this rank's start): vLLM's external_launcher runs one scheduler per rank, and the ranks of a group
        stay in step only if they submit the same requests in the same order. A collective over the group:
        its ranks must call ``generate`` the same number of times with the same ``n`` and sampling."""
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        parts: list = [None] * group.world_size
        torch.distributed.all_gather_object(parts, (mine, index, n, params), group=group.cpu_group)
        if any((pn, pp) != (n, params) for _, _, pn, pp in parts):
            raise RuntimeError(f"rollout.tensor_parallel_size={self.tp}: the ranks of one engine called generate "
                               f"with different n / sampling parameters: {[(pn, pp) for _, _, pn, pp in parts]}")
        first = sum(len(p[0]) for p in parts[:group.rank_in_group])
        return [p[0] for p in parts], [g for p in parts for g in p[1]], first

    # -- generation ------------------------------------------------------------------------------
    def _sampling(self, params: SamplingParams, seed: Optional[int]):
        from vllm import SamplingParams as VSamplingParams

        greedy = params.temperature <= 0
        return VSamplingParams(
            n=1, max_tokens=int(params.max_new_tokens), temperature=0.0 if greedy else float(params.temperature),
            top_p=1.0 if greedy else float(params.top_p), top_k=0 if greedy else int(params.top_k),
            seed=None if greedy else seed, stop_token_ids=list(self.stop_ids), ignore_eos=True,
            logprobs=0, detokenize=False, skip_special_tokens=False)

    @contextlib.contextmanager
    def awake(self):
        """The engine stays awake across the calls of the block (a multi-turn rollout's turns: their prefixes
        stay in the prefix cache), and sleeps after it as after one call."""
        self.held = True
        try:
            yield
        finally:
            self.held = False
            if self.free_cache_engine and not self.asleep:
                self.llm.sleep(level=1)
                self.asleep = True

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Optional[Sequence[int]] = None, sample_index: Optional[Sequence[int]] = None,
                 offset: Optional[Sequence[int]] = None) -> Rollout:
        """``sample_index`` / ``offset`` (n = 1, one per prompt): each row's sample index and the response
        position it starts at (a multi-turn episode's later turns), in its request seed."""
        from vllm.inputs import TokensPrompt

        from verirl.rollout.native import _check_prompt_index, _check_rows

        index = _check_prompt_index(prompt_index, len(prompt_ids))
        _check_rows(sample_index, offset, n, len(prompt_ids))
        if (sample_index is not None or offset is not None) and self.tp > 1:
            raise ValueError("rows keyed one by one (a multi-turn rollout) with a tensor-parallel vLLM engine are "
                             "not supported: set rollout.tensor_parallel_size=1")
        rows = list(sample_index) if sample_index is not None else None
        starts = list(offset) if offset is not None else [0] * len(prompt_ids)
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        mine = [[int(x) for x in p] for p in prompt_ids]
        every, first = [mine], 0
        if self.tp > 1:  # one engine for the group: every rank of it submits the group's prompts, in rank order
            every, index, first = self._group_prompts(mine, list(index), n, params)
        prompts, sampling = [], []
        for i, (p, g) in enumerate(zip((p for part in every for p in part), index)):
            for j in range(n):
                prompts.append(TokensPrompt(prompt_token_ids=p))
                seed = None if params.seed is None else request_seed(
                    params.seed, g, j if rows is None else rows[i], 0 if rows is None else starts[i])
                sampling.append(self._sampling(params, seed))
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self.lora_request) \
            if prompts else []
        outputs = outputs[first * n:(first + len(mine)) * n]  # this rank's rows
        R = params.max_new_tokens
        N = len(mine) * n
        tokens = torch.full((N, R), self.pad_id, dtype=torch.long)
        logps = torch.zeros((N, R), dtype=torch.float32)
        got = [0] * N  # tokens of each row (fewer than R without a stop: the context length was reached)
        for i, out in enumerate(outputs):
            c = out.outputs[0]
            toks = list(c.token_ids)[:R]
            got[i] = len(toks)
            tokens[i, :len(toks)] = torch.as_tensor(toks, dtype=torch.long)
            if c.logprobs is not None:
                logps[i, :len(toks)] = torch.tensor([d[t].logprob for d, t in zip(c.logprobs, toks)],
                                                    dtype=torch.float32)
        if self.free_cache_engine and not self.held:
            self.llm.sleep(level=1)  # weights to host memory, KV cache freed, until the next push / rollout
            self.asleep = True
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_id)
        rollout = build_rollout(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), tokens,
                                self.stop_ids, self.pad_id, lengths=got)
        rollout.sample_logprobs = logps[:, :rollout.response_ids.shape[1]] * rollout.response_mask
        if device.type != "cpu":
            rollout = Rollout(*(t.to(device) for t in (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                                       rollout.response_mask, rollout.loss_mask, rollout.stopped,
                                                       rollout.sample_logprobs)))
        return rollout


def vllm_options(r, lm, dtype: str, override_config: dict, max_num_seqs: int, max_model_len: int, seed: int,
                 tensor_parallel_size: int = 1, lora_rank: int = 0) -> dict:
    """The vLLM engine's keyword arguments from the rollout section ``r`` (training and `verirl eval`;
    ``tensor_parallel_size``: the engine's, resolved); the context length at most the model's (vLLM
    refuses more)."""
    max_model_len = min(max_model_len, getattr(lm.model.config, "max_position_embeddings", None) or max_model_len)
    return dict(path=lm.path, tokenizer=lm.tokenizer, dtype=dtype, override_config=override_config,
                tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=r.gpu_memory_utilization,
                max_num_seqs=max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
                enable_chunked_prefill=r.enable_chunked_prefill, enforce_eager=r.enforce_eager,
                free_cache_engine=r.free_cache_engine, max_model_len=max_model_len, seed=seed, lora_rank=lora_rank)
