"""`verirl plan` (and `verirl train --dry-run`): the layout of a run, worked out before it starts.

`make_plan` resolves nothing itself: it takes the `Config` that `verirl train` would run, runs
every check that needs no model (`verirl.run.checks.check`, the layout's among them), and derives,
per step and per rank, how many prompts and sequences each rank holds, how many mini-batches and
optimizer steps a step takes, the micro-batches or token budgets of the passes, which passes run,
the threads and reward workers of each rank, and an estimate of the memory of each rank. The
model is never loaded: only its config.json is read (transformers' `AutoConfig`).

The layout's own arithmetic and names (`verirl.config.layout`) are the trainer's and the launcher's.

The counting rules (docs/plan.md): ``data.prompts_per_step`` and ``actor.mini_batch_prompts``
count PROMPTS, each sampled ``rollout.n`` times; ``actor.micro_batch_size`` and
``rollout.micro_batch_size`` count SEQUENCES; token budgets count tokens per forward, per rank.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from verirl.config import Config
from verirl.core.errors import ConfigError, ModelError
from verirl.config.layout import (REWARD_WORKERS_CAP, cpu_cores, producers, reward_workers_per_rank,
                                  rollout_tensor_parallel, threads_per_rank, world_size)
from verirl.models.device import visible_devices

__all__ = ["make_plan", "render", "Plan", "count_parameters", "count_adapters"]

OPTIMIZER_BYTES = 8  # AdamW: two float32 moments per parameter
LOGITS_BYTES = 4  # the output layer's logits are float32
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The activations kept for the backward of one decoder layer, per token, in elements of model.dtype
# (no activation checkpointing; fused attention, which keeps no T x T scores): the input and the
# output of both norms (4 h), the rotated queries and keys and the values before and after the
# attention (about 3 h_q + 4 kv), the attention output (h), the MLP's gate, up, activation and
# product (4 i; for a mixture of experts, i of the experts a token visits).
ACTIVATION_FORMULA = "(8 h + 4 kv + 4 i) x bytes per token per layer"


# ---------------------------------------------------------------- parameters from config.json

FORMULA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3")


@dataclass
class Shape:
    """What the estimate needs of a model's config.json."""
    model_type: str
    hidden: int  # h
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # i of a dense MLP
    vocab: int
    tied: bool  # the output layer shares the embedding matrix
    active_intermediate: float  # i per token, averaged over layers (a mixture of experts: the experts a token visits)
    kv_width: int = 0  # the keys' and values' width per token the attention keeps (kv_heads x head_dim; MLA: expanded)
    cache_width: int = 0  # elements per token per layer in the KV cache (2 x kv_width; MLA: the compressed latent)


@dataclass(frozen=True)
class Experts:
    """The routed experts of a mixture of experts, from config.json: in each sparse layer ``experts``
    SwiGLU MLPs of width ``intermediate``, of which each token visits ``per_token``, beside a shared
    expert of width ``shared`` that every token visits (0: none)."""
    layers: int  # sparse decoder layers
    experts: int  # E, routed experts per sparse layer
    per_token: int  # k, num_experts_per_tok
    intermediate: int  # each routed expert's width
    shared: int  # the shared experts' width per sparse layer (0 without)

    def routed(self, hidden: int) -> int:
        """Parameters of all the routed experts: E x 3 x h x i per sparse layer (gate, up, down; no biases)."""
        return self.layers * self.experts * 3 * hidden * self.intermediate


def _moe_layers(c, model_type: str) -> list[bool]:
    """Which decoder layers are a mixture of experts."""
    L = c.num_hidden_layers
    if model_type == "mixtral":
        return [True] * L
    if model_type in ("qwen2_moe", "qwen3_moe"):
        only = set(getattr(c, "mlp_only_layers", None) or [])
        return [i not in only and c.num_experts > 0 and (i + 1) % c.decoder_sparse_step == 0 for i in range(L)]
    if model_type == "deepseek_v3":
        return [i >= (c.first_k_dense_replace or 0) for i in range(L)]
    return [False] * L


def moe_experts(config) -> Optional[Experts]:
    """The routed experts of a mixture-of-experts family of `FORMULA_FAMILIES`; None for a dense model."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "") or ""
    if model_type not in FORMULA_FAMILIES:
        return None
    layers = sum(_moe_layers(c, model_type))
    if not layers:
        return None
    if model_type == "mixtral":
        return Experts(layers, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, 0)
    if model_type == "deepseek_v3":
        return Experts(layers, c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                       (c.n_shared_experts or 0) * c.moe_intermediate_size)
    shared = c.shared_expert_intermediate_size if model_type == "qwen2_moe" else 0
    return Experts(layers, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, shared)


def model_shape(config) -> Shape:
    """The shape of the decoder stack (the text model of a multimodal config)."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "") or ""
    h, L = c.hidden_size, c.num_hidden_layers
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    hd = getattr(c, "head_dim", None) or h // heads
    inter = getattr(c, "intermediate_size", None) or 4 * h
    tied = bool(getattr(c, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    moe = _moe_layers(c, model_type) if model_type in FORMULA_FAMILIES else [False] * L
    ex = moe_experts(config)
    if ex is not None:
        per_layer = [ex.per_token * ex.intermediate + ex.shared if m else inter for m in moe]
        active = sum(per_layer) / L
    else:
        active = float(inter)
    kv_width, cache_width = kv * hd, 2 * kv * hd
    if model_type == "deepseek_v3":  # MLA: the cache keeps one latent per token; attention expands it for every head
        kv_width = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) // 2
        cache_width = c.kv_lora_rank + c.qk_rope_head_dim
    return Shape(model_type, h, L, heads, kv, hd, inter, c.vocab_size, tied, active, kv_width, cache_width)


def _mla_attention(c) -> int:
    """DeepSeek-V3's multi-head latent attention, per layer: queries through a rank-q_lora_rank bottleneck
    (with its norm) or a full projection, keys and values through the kv_lora_rank latent (with its norm)
    plus a shared rotary key of qk_rope_head_dim, expanded per head to qk_nope_head_dim keys and
    v_head_dim values, and the output projection."""
    h, n, bias = c.hidden_size, c.num_attention_heads, bool(getattr(c, "attention_bias", False))
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    r, latent = c.q_lora_rank, c.kv_lora_rank + c.qk_rope_head_dim
    q = h * n * qk if r is None else h * r + (r if bias else 0) + r + r * n * qk
    kv = h * latent + (latent if bias else 0) + c.kv_lora_rank + c.kv_lora_rank * n * (c.qk_nope_head_dim + c.v_head_dim)
    return q + kv + n * c.v_head_dim * h + (h if bias else 0)


def count_parameters(config) -> tuple[int, dict[str, int]]:
    """(total, by part) parameters of a causal LM of a known family (`FORMULA_FAMILIES`), counted from
    its config: embeddings, each layer's attention (with its biases and q/k norms; DeepSeek-V3's latent
    attention), the dense MLPs with a mixture of experts' routers and shared experts ("mlp"), the routed
    experts ("experts", a mixture of experts only), norms, and the output layer unless tied to the
    embeddings. Raises ValueError for another family."""
    model_type = getattr(config, "model_type", "")
    if model_type not in FORMULA_FAMILIES:
        raise ValueError(f"no parameter formula for model_type {model_type!r}")
    c = config
    s = model_shape(config)
    h, hd, q_width, kv_width = s.hidden, s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim
    qkv_bias = {"qwen2": True, "qwen2_moe": bool(getattr(c, "qkv_bias", True)),
                "llama": bool(getattr(c, "attention_bias", False)), "qwen3": bool(getattr(c, "attention_bias", False)),
                "qwen3_moe": bool(getattr(c, "attention_bias", False))}.get(model_type, False)
    o_bias = qkv_bias and model_type in ("llama", "qwen3", "qwen3_moe")
    attention = h * q_width + 2 * h * kv_width + q_width * h
    attention += (q_width + 2 * kv_width if qkv_bias else 0) + (h if o_bias else 0)
    attention += 2 * hd if model_type in ("qwen3", "qwen3_moe") else 0  # q_norm, k_norm
    if model_type == "deepseek_v3":
        attention = _mla_attention(c)
    mlp_bias = model_type == "llama" and bool(getattr(c, "mlp_bias", False))
    dense = 3 * h * s.intermediate + (2 * s.intermediate + h if mlp_bias else 0)
    ex = moe_experts(config)
    sparse = sum(_moe_layers(c, model_type))
    mlp = (s.layers - sparse) * dense
    if ex is not None:
        mlp += ex.layers * ex.experts * h  # the routers
        mlp += ex.layers * 3 * h * ex.shared  # the shared experts
        mlp += ex.layers * h if model_type == "qwen2_moe" else 0  # the shared expert's sigmoid gate
    parts = {"embeddings": s.vocab * h, "attention": s.layers * attention, "mlp": mlp,
             **({"experts": ex.routed(h)} if ex is not None else {}),
             "norms": s.layers * 2 * h + h, "output layer": 0 if s.tied else s.vocab * h}
    return sum(parts.values()), parts


def count_active(config) -> tuple[int, int]:
    """(active, routed) parameters of a known family (`FORMULA_FAMILIES`): those one token's forward
    touches (everything but the routed experts it does not visit: k of E in each sparse layer; the
    embedding counted whole, as the published counts do), and those of all the routed experts.
    (total, 0) for a dense model. Raises ValueError for another family."""
    total, _ = count_parameters(config)
    ex = moe_experts(config)
    if ex is None:
        return total, 0
    routed = ex.routed(model_shape(config).hidden)
    return total - routed + routed // ex.experts * ex.per_token, routed


def human_count(n: float) -> str:
    """A parameter count in three significant digits: 30.5B, 3.35B, 671B, 1.03M."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            v = n / size
            return f"{v:#.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def count_parameters_on_meta(config) -> int:
    """The exact count for any architecture transformers knows: the model built on the meta device
    (shapes only, no memory, no weights read)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def read_model_config(path: str):
    """The model's config.json through transformers' AutoConfig (no weights, no tokenizer)."""
    from transformers import AutoConfig

    from verirl.models.load import resolve_path

    real = resolve_path(path)
    try:
        return AutoConfig.from_pretrained(real)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"model.path='{path}': its config.json cannot be read by transformers' AutoConfig: "
                         f"{type(e).__name__}: {' '.join(str(e).split())} Check the file, or update transformers "
                         f"for a newer architecture.") from None


# ---------------------------------------------------------------- LoRA adapters from config.json

# The linear layers of the dense families' decoder layers (llama, mistral, qwen2, qwen3), and the output layer
DENSE_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OUTPUT_LAYER = "lm_head"


@dataclass
class Adapters:
    """actor.lora's adapters, counted from the model's config: each adapted linear layer of shape
    (out, in) gains A (rank x in) and B (out x rank), rank x (in + out) parameters."""
    rank: int
    target_modules: list[str]  # the layers' names, "all-linear" resolved (every linear layer but the output layer)
    parameters: int  # of the whole model
    by_module: dict[str, int]  # parameters per target name, over all the layers that carry it
    layers: int  # adapted layers in the whole model
    counted: str  # "formula" (the dense families) or "meta device" (peft's adapters on the model built there)
    per_token_layer: int = 0  # activations the adapters keep per token per decoder layer, in elements
    held: int = 0  # on the most loaded rank before sharding (pipeline stages: its layers'; else all)


def _meta_model(config):
    """The causal LM of ``config`` built on the meta device (shapes only). Raises EstimateUnavailable."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises for a model it cannot build
        raise EstimateUnavailable(f"transformers cannot build it as a causal LM ({type(e).__name__})") from None


def _dense_shapes(config) -> Optional[dict[str, list[tuple[int, int]]]]:
    """{name: [(in, out) of each layer by that name]} of a dense family's linear layers (`DENSE_LINEARS` in
    each decoder layer, the output layer once), from config.json alone; None for another model."""
    model_type = getattr(config, "model_type", "")
    if model_type not in FORMULA_FAMILIES or model_type == "deepseek_v3" or any(_moe_layers(config, model_type)):
        return None
    s = model_shape(config)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_layer = {"q_proj": (s.hidden, q), "k_proj": (s.hidden, kv), "v_proj": (s.hidden, kv), "o_proj": (q, s.hidden),
                 "gate_proj": (s.hidden, s.intermediate), "up_proj": (s.hidden, s.intermediate),
                 "down_proj": (s.intermediate, s.hidden)}
    shapes = {name: [per_layer[name]] * s.layers for name in DENSE_LINEARS}
    shapes[OUTPUT_LAYER] = [(s.hidden, s.vocab)]
    return shapes


def _model_shapes(model) -> tuple[dict[str, list[tuple[int, int]]], str]:
    """({name: [(in, out)]} of a built model's nn.Linear layers by their last name, the output layer's name)."""
    import torch

    shapes: dict[str, list[tuple[int, int]]] = {}
    output, out_name = model.get_output_embeddings(), ""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name:
            last = name.rsplit(".", 1)[-1]
            shapes.setdefault(last, []).append((m.in_features, m.out_features))
            out_name = last if m is output else out_name
    return shapes, out_name


def _peft_counts(model, rank: int, targets) -> tuple[dict[str, int], int]:
    """({target name: adapter parameters}, adapted layers) of peft's adapters injected into ``model`` (on the
    meta device): exact for whatever peft adapts (a mixture of experts' router and fused experts too)."""
    import warnings

    from verirl.models.lora import LoraSettings, apply_lora, lora_layers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes on the patterns of the layers a model lacks
        apply_lora(model, LoraSettings(rank, float(rank), target_modules=targets))
    by_module: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            owner = name.split(".lora_")[0].replace(".base_layer", "").rsplit(".", 1)[-1]
            by_module[owner] = by_module.get(owner, 0) + p.numel()
    return by_module, len(lora_layers(model))


def count_adapters(config, rank: int, targets, dropout: float = 0.0, path: str = "") -> Adapters:
    """The adapters of ``targets`` ("all-linear" or module names, as `verirl.models.lora.target_modules`
    gives them) at ``rank``: rank x (in + out) for each targeted linear layer, from the shapes for the dense
    families, otherwise peft's own adapters on the model built on the meta device. Raises ConfigError for a
    name that is no linear layer of the model (the error names those it has), EstimateUnavailable when the
    model's layers cannot be known."""
    shapes, output, model = _dense_shapes(config), OUTPUT_LAYER, None
    if shapes is None:
        model = _meta_model(config)
        shapes, output = _model_shapes(model)
    names = sorted(shapes)
    if targets != "all-linear":
        unknown = [n for n in targets if n not in shapes]
        if unknown or not targets:
            where = f"model.path={path}" if path else "the model"
            what = (f"{', '.join(unknown)} {'is not a linear layer' if len(unknown) == 1 else 'are not linear layers'}"
                    f" of {where}" if unknown else "names no layer")
            raise ConfigError(
                f"actor.lora.target_modules={list(targets)}: {what} ({getattr(config, 'model_type', '?')}, from its "
                f"config.json). Its linear layers: {', '.join(names)}; all-linear adapts every one of them but the "
                f"output layer{f' {output}' if output else ''}. Give some of these names, e.g. "
                f"actor.lora.target_modules=[q_proj,v_proj], or all-linear.")
    wanted = [n for n in names if n != output] if targets == "all-linear" else list(dict.fromkeys(targets))
    if model is None:
        by_module = {n: sum(rank * (i + o) for i, o in shapes[n]) for n in wanted}
        adapted, counted = sum(len(shapes[n]) for n in wanted), "formula"
    else:
        by_module, adapted = _peft_counts(model, rank, targets)
        counted = "meta device"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = max(getattr(text, "num_hidden_layers", 1) or 1, 1)
    # what the adapters keep for the backward, per token and decoder layer: A x (rank), and x itself with dropout
    per_token = sum(len(shapes.get(n, ())) * (rank + (shapes[n][0][0] if dropout > 0 else 0))
                    for n in wanted if n != output) // layers
    return Adapters(rank, sorted(by_module) if model is not None else wanted, sum(by_module.values()), by_module,
                    adapted, counted, per_token)


class EstimateUnavailable(Exception):
    """The model's config does not give what the memory estimate needs (the plan goes on without it)."""


# ---------------------------------------------------------------- the plan

@dataclass
class Layout:
    world_size: int
    nproc_per_node: int
    nnodes: int
    launcher: str
    strategy: str  # fsdp2 / ddp, or "none" with one rank
    group_size: int  # rollout.n
    prompts_per_step: int
    prompts_per_rank: int
    sequences_per_step: int
    sequences_per_rank: int
    mini_batch_prompts: int
    mini_batches_per_step: int
    epochs: int
    optimizer_steps_per_step: int
    mini_batch_prompts_per_rank: int
    mini_batch_sequences_per_rank: int
    max_sequence_length: int  # data.max_prompt_length + rollout.max_new_tokens
    micro_batch_size: int  # sequences per forward/backward when token_budget is 0
    token_budget: int  # actor.max_token_len_per_device: tokens per forward/backward, per rank (0 = by sequences)
    micro_batches_per_mini_batch: int  # per rank; with a token budget, at most (every sequence at full length)
    old_log_prob_pass: bool  # False: on-policy, the update's own log-probs are the old ones
    old_log_prob_micro_batches: int  # per rank per step (0 when skipped)
    reference_pass: bool  # algo.kl_coef > 0
    ref_token_budget: int  # tokens per reference forward (0 = by sequences)
    ref_micro_batches: int  # per rank per step (0 when skipped); with a budget, at most
    generate_calls_per_rank: int
    sequences_per_generate_call: int
    tensor_parallel: int = 1  # actor.tensor_parallel_size: ranks that split each layer
    data_parallel: int = 1  # world / tensor_parallel: the parts the step's data is split into
    rollout_tensor_parallel: int = 1  # rollout.tensor_parallel_size: 1 = each rank decodes with whole weights
    sequence_parallel: int = 1  # actor.sequence_parallel_size: ranks that split each micro-batch's tokens
    pipeline_parallel: int = 1  # actor.pipeline_parallel_size: stages of decoder layers
    pipeline_schedule: str = "1f1b"
    pipeline_layers: tuple = ()  # decoder layers per stage (empty: an even split)
    pipeline_bubble: float = 0.0  # the share of a pipelined pass each rank waits, at the planned micro-batches
    producers: int = 0  # rollout.placement=separate: processes that generate and score (not in world_size)
    max_staleness: int = 0  # trainer.async_training.max_staleness
    async_mode: str = ""  # trainer.async_training.mode with producers
    lora_rank: int = 0  # actor.lora.rank: adapters trained, the reference the actor with them off (0 = off)
    expert_parallel: int = 1  # actor.expert_parallel_size: ranks of the dp x sp group that split the routed experts
    expert_data_parallel: int = 1  # edp: the ranks of the dp x sp group that hold the same experts, (dp x sp) / ep

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s place on the mesh (dp, pp, sp, tp; the last the innermost): its coordinates."""
        tp, sp, pp = self.tensor_parallel, self.sequence_parallel, self.pipeline_parallel
        return {"dp": rank // (tp * sp * pp), "pp": rank // (tp * sp) % pp, "sp": rank // tp % sp, "tp": rank % tp}

    def expert_coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s place on the (edp, ep) split of the dp x sp group (ep innermost): ep picks its experts."""
        c = self.coordinates(rank)
        flat = c["dp"] * self.sequence_parallel + c["sp"]
        return {"edp": flat // self.expert_parallel, "ep": flat % self.expert_parallel}


@dataclass
class Resources:
    cores: int
    local_ranks: int
    threads_per_rank: int
    threads_from: str
    reward_workers_per_rank: int
    reward_workers_from: str


@dataclass
class Memory:
    """Bytes per rank, an estimate from the model's config (see `leaves_out`)."""
    model_type: str
    parameters: int
    parameters_by_part: dict[str, int]  # empty when counted on the meta device
    counted: str  # "formula" or "meta device"
    dtype: str
    bytes_per_parameter: int
    shards: int  # parameters, gradients, optimizer state and the reference divided by this (fsdp2)
    tokens_per_forward: int
    params: int
    grads: int
    optimizer: int
    reference: int
    activations: int
    output_layer: int
    kv_cache: int
    rollout_params: int  # the full parameters generation runs on (and, sharded, the shard too)
    update_phase: int
    rollout_phase: int
    peak: int
    formulas: dict[str, str] = field(default_factory=dict)
    leaves_out: list[str] = field(default_factory=list)
    trained_parameters: int = 0  # what the optimizer updates: every parameter, or (LoRA) the adapters
    trained_share: float = 1.0  # of all the parameters the actor holds (the base's and the adapters')
    model_states: int = 0  # params + grads + optimizer + reference: what perf/model_states_gb measures
    adapters: Optional[Adapters] = None  # actor.lora.rank > 0
    active_parameters: int = 0  # those one token's forward touches (a mixture of experts: k of E routed experts)
    routed_parameters: int = 0  # a mixture of experts' routed experts, all of them (0: dense, or counted on meta)
    expert_states: int = 0  # bytes per rank of the routed experts' params + grads + optimizer + reference
    flops_per_token: int = 0  # a forward's matmul FLOPs per token: 2 x the active weights that multiply (0: unknown)
    expert_parallel: int = 1  # actor.expert_parallel_size
    experts_per_rank: int = 0  # routed experts of each sparse layer on one rank: E / ep (0: dense, or counted on meta)
    expert_shards: int = 1  # the routed experts' states divided by this: ep (x edp under FSDP2); `shards` at ep 1
    all_to_all_forward: int = 0  # bytes one rank sends per sparse layer per micro-batch, forward (dispatch + combine)
    all_to_all_update: int = 0  # the same, forward and backward (the update's micro-batches)
    all_to_all_micro_batch: int = 0  # all_to_all_update over this rank's sparse layers: one update micro-batch


@dataclass
class Plan:
    source: str  # the --config given (a recipe name or a file)
    model_path: str
    layout: Layout
    resources: Resources
    memory: Optional[Memory]
    memory_note: str = ""  # why there is no estimate, when there is none

    def to_dict(self) -> dict:
        return asdict(self)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _micro_batches(sequences: int, micro_batch_size: int, budget: int, longest: int) -> int:
    """Micro-batches for ``sequences`` sequences: by count, or (budget) at most, every sequence at
    its longest."""
    if sequences == 0:
        return 0
    if budget > 0:
        return _ceil(sequences, max(1, budget // longest))
    return _ceil(sequences, micro_batch_size)


def make_layout(cfg: Config) -> Layout:
    t, data, actor, rollout = cfg.trainer, cfg.data, cfg.actor, cfg.rollout
    world, n, tp = world_size(cfg), rollout.n, actor.tensor_parallel_size
    sp, pp = actor.sequence_parallel_size, actor.pipeline_parallel_size
    dp = max(world // (tp * sp * pp), 1)
    per_rank = data.prompts_per_step // dp  # every rank of a tensor-parallel group holds the same prompts
    mb_per_rank = actor.mini_batch_prompts // dp
    mini_batches = data.prompts_per_step // actor.mini_batch_prompts
    longest = data.max_prompt_length + rollout.max_new_tokens
    on_policy = mini_batches == 1 and actor.epochs == 1
    ref = cfg.algo.kl_coef > 0
    ref_budget = cfg.ref.log_prob_max_token_len_per_device or actor.max_token_len_per_device
    rollout_tp = rollout_tensor_parallel(cfg)
    replica = (sp if rollout_tp > 1 else tp * sp) * pp  # ranks decoding shares of one dp's prompts
    decoded = _ceil(per_rank, replica)
    per_call = decoded if rollout.micro_batch_size <= 0 else min(decoded, max(1, rollout.micro_batch_size // n))
    budget = actor.max_token_len_per_device * sp  # a sequence-parallel group packs each rank's budget sp times over
    return Layout(
        world_size=world, nproc_per_node=t.nproc_per_node, nnodes=t.nnodes, launcher=t.launcher,
        strategy=actor.strategy if world > 1 else "none", group_size=n,
        producers=producers(cfg), max_staleness=t.async_training.max_staleness,
        async_mode=t.async_training.mode if producers(cfg) else "",
        prompts_per_step=data.prompts_per_step, prompts_per_rank=per_rank,
        sequences_per_step=data.prompts_per_step * n, sequences_per_rank=per_rank * n,
        mini_batch_prompts=actor.mini_batch_prompts, mini_batches_per_step=mini_batches, epochs=actor.epochs,
        optimizer_steps_per_step=mini_batches * actor.epochs,
        mini_batch_prompts_per_rank=mb_per_rank, mini_batch_sequences_per_rank=mb_per_rank * n,
        max_sequence_length=longest, micro_batch_size=actor.micro_batch_size,
        token_budget=actor.max_token_len_per_device,
        micro_batches_per_mini_batch=_micro_batches(mb_per_rank * n, actor.micro_batch_size, budget, longest),
        old_log_prob_pass=not on_policy,
        old_log_prob_micro_batches=0 if on_policy else _micro_batches(
            per_rank * n, actor.micro_batch_size, budget, longest),
        reference_pass=ref, ref_token_budget=ref_budget if ref else 0,
        ref_micro_batches=_micro_batches(per_rank * n, actor.micro_batch_size, ref_budget * sp, longest) if ref else 0,
        generate_calls_per_rank=_ceil(decoded, per_call), sequences_per_generate_call=per_call * n,
        tensor_parallel=tp, data_parallel=dp, rollout_tensor_parallel=rollout_tp,
        sequence_parallel=sp, pipeline_parallel=pp, pipeline_schedule=actor.pipeline_schedule,
        pipeline_layers=tuple(actor.pipeline_layers), pipeline_bubble=_bubble(actor, pp, mb_per_rank * n, longest),
        lora_rank=actor.lora.rank, expert_parallel=actor.expert_parallel_size,
        expert_data_parallel=max(dp * sp // actor.expert_parallel_size, 1))


def pipeline_micro_batches(actor, pp: int, sequences: int, longest: int) -> int:
    """Micro-batches of a pipelined pass over ``sequences``: the planned ones, at least one per stage."""
    from verirl.models.pipeline import stages_per_rank

    budget = actor.max_token_len_per_device * actor.sequence_parallel_size
    return max(_micro_batches(sequences, actor.micro_batch_size, budget, longest),
               pp * stages_per_rank(actor.pipeline_schedule))


def _bubble(actor, pp: int, sequences: int, longest: int) -> float:
    """The pipeline bubble of the update's schedule at the planned micro-batches of a mini-batch (at least
    one per stage), 0 without pipeline stages."""
    if pp == 1:
        return 0.0
    from verirl.models.pipeline import bubble_fraction, stages_per_rank

    m = pipeline_micro_batches(actor, pp, sequences, longest)
    per_rank = stages_per_rank(actor.pipeline_schedule)
    return bubble_fraction(actor.pipeline_schedule, pp, m, per_rank) if actor.pipeline_schedule in (
        "1f1b", "gpipe", "interleaved_1f1b") else 0.0


def _held(total: int, parts: dict, config, layout: Layout) -> int:
    """Parameters the most loaded pipeline rank holds: its stages' layers, with the embedding on the first
    stage, the final norm and the output layer (or the tied embedding's copy) on the last."""
    if layout.pipeline_parallel == 1:
        return total
    from verirl.models.pipeline import stage_indices, stage_layers, stages_per_rank

    per_rank = stages_per_rank(layout.pipeline_schedule)
    stages = layout.pipeline_parallel * per_rank
    L = config.num_hidden_layers
    split = stage_layers(L, stages, list(layout.pipeline_layers) or None)
    embed = parts.get("embeddings", 0)
    head = parts.get("output layer", 0) or (embed if getattr(config, "tie_word_embeddings", False) else 0)
    layer = (total - embed - parts.get("output layer", 0)) / L if parts else total / L
    most = 0
    for rank in range(layout.pipeline_parallel):
        held = 0
        for s in stage_indices(rank, layout.pipeline_parallel, per_rank):
            held += len(split[s]) * layer + (embed if s == 0 else 0) + (head if s == stages - 1 else 0)
        most = max(most, int(held))
    return most


def make_resources(cfg: Config, cores: Optional[int] = None) -> Resources:
    cores = cores or cpu_cores()
    local = cfg.trainer.nproc_per_node
    threads = threads_per_rank(cfg, cores)
    threads_from = (f"trainer.threads={cfg.trainer.threads}" if cfg.trainer.threads > 0
                    else f"trainer.threads=0: cores {cores} // local ranks {local}")
    workers = reward_workers_per_rank(cfg, cores)
    if cfg.reward.workers > 0:
        workers_from = f"reward.workers={cfg.reward.workers}"
    elif cfg.reward.workers == 0:
        workers_from = "reward.workers=0: scored in the rank's own process, no timeout"
    else:
        workers_from = f"reward.workers=-1: min(cores {cores} // local ranks {local}, {REWARD_WORKERS_CAP}), at least 1"
    return Resources(cores, local, threads, threads_from, workers, workers_from)


def _layers_held(config, layout: Layout) -> int:
    """Decoder layers on the pipeline rank that holds the most (all of them without stages)."""
    L = model_shape(config).layers
    if layout.pipeline_parallel == 1:
        return L
    from verirl.models.pipeline import stage_indices, stage_layers, stages_per_rank

    per_rank = stages_per_rank(layout.pipeline_schedule)
    split = stage_layers(L, layout.pipeline_parallel * per_rank, list(layout.pipeline_layers) or None)
    return max(sum(len(split[s]) for s in stage_indices(r, layout.pipeline_parallel, per_rank))
               for r in range(layout.pipeline_parallel))


def lora_adapters(cfg: Config, config, layout: Optional[Layout] = None) -> Optional[Adapters]:
    """actor.lora's adapters on this model (None when actor.lora.rank is 0), ``held`` on the most loaded
    pipeline rank (the output layer's adapter counted on it too). Raises ConfigError for target_modules
    naming a layer the model does not have."""
    lo = cfg.actor.lora
    if not lo.rank:
        return None
    from verirl.models.lora import target_modules

    adapters = count_adapters(config, lo.rank, target_modules(lo.target_modules), lo.dropout, cfg.model.path)
    adapters.held = adapters.parameters
    if layout is not None and layout.pipeline_parallel > 1:
        head = adapters.by_module.get(OUTPUT_LAYER, 0)
        L = model_shape(config).layers
        adapters.held = (adapters.parameters - head) * _layers_held(config, layout) // L + head
    return adapters


def _moe_formulas(config, layout: Layout, b: int, shards: int, routed: int, routed_held: int, per_param: int,
                  lora: bool, reference: bool, total: int, active: int, flops: int,
                  tokens: int = 0) -> dict[str, str]:
    """How the active parameters, the routed experts' states and the FLOPs per token are counted."""
    out = {"flops": (f"a forward: 2 x {human_count(flops // 2)} weights that multiply (the active parameters less the "
                     f"embedding lookup and the norms, the output layer counted); the update x 3 (its backward "
                     f"twice the forward), each log-prob pass x 1; attention's scores add 4 x layers x query width "
                     f"x keys attended") if flops else ""}
    ex = moe_experts(config) if routed else None
    if ex is None:
        return out
    L = model_shape(config).layers
    shared = f" and a shared expert of width {ex.shared} that every token visits" if ex.shared else ""
    out["size"] = (f"{human_count(total)} total, {human_count(active)} active per token: each token visits "
                   f"{ex.per_token} of {ex.experts} routed experts (width {ex.intermediate}) in {ex.layers} of {L} "
                   f"layers{shared}; the routed experts hold {human_count(routed)} ({routed / total:.0%} of all), "
                   f"{human_count(routed // ex.experts * ex.per_token)} of them per token")
    states = (f"params {b}" + ("" if lora else f" + grads {b} + AdamW {OPTIMIZER_BYTES}")
              + (f" + reference {b}" if reference else ""))
    stages = " (this rank's stages)" if layout.pipeline_parallel > 1 else ""
    ep, edp = layout.expert_parallel, layout.expert_data_parallel
    if ep > 1:
        n = ex.experts // ep
        over = (f" / edp {edp}: FSDP2 shards each slice over the {edp} ranks that hold the same experts"
                if layout.strategy == "fsdp2" and edp > 1 else
                f"; the {edp} edp ranks of an ep coordinate each hold its slice whole (actor.strategy="
                f"{layout.strategy})" if edp > 1 else "")
        out["experts"] = (f"actor.expert_parallel_size {ep}: {ex.experts} / {ep} = {n} experts per rank x {ex.layers} "
                          f"sparse layers x 3 x {model_shape(config).hidden} x "
                          f"{ex.intermediate} = {routed_held // ep:,} parameters x ({states}) B{over}; included in "
                          f"the states above")
        h = model_shape(config).hidden
        out["all_to_all"] = (f"dispatch + combine: 2 x {tokens:,} tokens x k {ex.per_token} x {h} x {b} B "
                             f"(model.dtype) x (ep - 1) / ep = {ep - 1}/{ep} (the share of a rank's token rows whose "
                             f"experts are on other ranks, with a balanced router), per rank, forward")
        out["all_to_all_micro_batch"] = (f"x 2 with the backward (the reverse exchanges) x {ex.layers} sparse layers: "
                                         f"one update micro-batch; the old-log-prob and reference passes' forwards "
                                         f"send half of it")
        return out
    if shards > 1 and layout.strategy == "fsdp2":
        where = f"/ {shards}: FSDP2 shards them like any weight"
    elif layout.world_size > 1:
        where = f"every rank holds every expert (actor.strategy={layout.strategy}: all {ex.experts} of each layer)"
    else:
        where = f"one rank holds all {ex.experts} experts of each layer"
    out["experts"] = (f"{routed_held:,} routed-expert parameters{stages} x ({states}) B; {where}; "
                      f"actor.expert_parallel_size=ep splits this part, {ex.experts}/ep experts per rank (included in "
                      f"the states above)")
    return out


def _per_rank(rest: int, experts: int, per: int, shards: int, expert_shards: int) -> int:
    """Bytes per rank of ``rest`` parameters divided by ``shards`` and ``experts`` by ``expert_shards``."""
    if expert_shards == shards:
        return (rest + experts) * per // shards
    return rest * per // shards + experts * per // expert_shards


def estimate_memory(cfg: Config, layout: Layout, config) -> Memory:
    """Bytes per rank: the model's states (sharded by fsdp2 over the world), the activations of one
    forward/backward at the token budget, one chunk of the output layer's logits, and the rollout's
    KV cache. An estimate: see ``leaves_out``. With actor.lora.rank > 0 the parameters are the frozen
    base's and the adapters', the gradients and AdamW's moments the adapters' alone, and there is no
    reference copy (the reference is the base with the adapters off)."""
    try:
        shape = model_shape(config)
    except AttributeError as e:  # not a decoder-only language model's config
        raise EstimateUnavailable(f"its config has no {e.name or 'expected key'}") from None
    try:
        total, parts = count_parameters(config)
        counted = "formula"
    except ValueError:  # another family: build it on the meta device
        try:
            total, parts, counted = count_parameters_on_meta(config), {}, "meta device"
        except Exception as e:  # noqa: BLE001 - whatever transformers raises for a model it cannot build
            why = " ".join(str(e).split())
            why = why if len(why) <= 160 else why[:160] + "..."
            raise EstimateUnavailable(
                f"transformers cannot build it as a causal LM ({type(e).__name__}: {why})") from None
    b = DTYPE_BYTES[cfg.model.dtype]
    tp = layout.tensor_parallel
    # FSDP2 shards over the data-parallel ranks, tensor parallelism splits every layer over its group (the norms,
    # a few thousandths of the parameters, stay whole: not counted)
    dp_shards = layout.data_parallel * layout.sequence_parallel  # FSDP2 shards over dp x sp
    shards = (dp_shards if layout.strategy == "fsdp2" and dp_shards > 1 else 1) * tp
    held = _held(total, parts, config, layout)  # this rank's pipeline stages (all of it without)
    adapters = lora_adapters(cfg, config, layout)
    extra = adapters.held if adapters else 0  # the adapters' parameters beside the frozen base's
    trained = extra if adapters else held  # what gets gradients and AdamW's moments
    active, routed = count_active(config) if counted == "formula" else (total, 0)
    # the routed experts' share of the states: every one on every rank without expert parallelism (FSDP2 shards them
    # like any weight); a pipeline rank holds its layers' experts; expert parallel: E/ep per rank, / edp under FSDP2
    routed_held = routed * _layers_held(config, layout) // shape.layers
    ep, edp = layout.expert_parallel, layout.expert_data_parallel
    expert_shards = shards if ep == 1 or not routed else ep * (edp if layout.strategy == "fsdp2" else 1)
    trained_experts = 0 if adapters else routed_held
    params = _per_rank(held + extra - routed_held, routed_held, b, shards, expert_shards)
    grads = _per_rank(trained - trained_experts, trained_experts, b, shards, expert_shards)
    optimizer = _per_rank(trained - trained_experts, trained_experts, OPTIMIZER_BYTES, shards, expert_shards)
    reference = _per_rank(held - routed_held, routed_held, b, shards, expert_shards) \
        if layout.reference_pass and adapters is None else 0
    if layout.token_budget > 0:
        tokens = layout.token_budget
    else:
        tokens = min(layout.micro_batch_size, layout.mini_batch_sequences_per_rank) * layout.max_sequence_length
        tokens = _ceil(tokens, layout.sequence_parallel)  # each rank of a sequence-parallel group holds its share
    kv_width = shape.kv_width
    per_token_layer = 8 * shape.hidden + (4 * kv_width + 4 * shape.active_intermediate) / tp  # heads, MLP split
    layers_held = shape.layers * held / max(total, 1) if layout.pipeline_parallel > 1 else shape.layers
    # micro-batches whose activations a stage keeps at once: 1F1B up to p, GPipe every one (all forwards first)
    in_flight = 1
    if layout.pipeline_parallel > 1:
        in_flight = layout.pipeline_parallel
        if layout.pipeline_schedule == "gpipe":
            in_flight = pipeline_micro_batches(cfg.actor, layout.pipeline_parallel,
                                               layout.mini_batch_sequences_per_rank, layout.max_sequence_length)
    lora_per_token_layer = adapters.per_token_layer if adapters else 0  # each adapted layer's A x (and dropout's x)
    activations = int(tokens * layers_held * (per_token_layer + lora_per_token_layer) * b * in_flight)
    from verirl.core.ops.head_logprobs import auto_chunk  # the rule the passes use (imports torch: here, not at start)

    vocab = shape.vocab // tp  # a vocabulary-parallel output layer: this rank's rows
    chunk = cfg.actor.logprob_chunk or auto_chunk(vocab, "cpu" if visible_devices(cfg.model.device) is None else "cuda")
    output_layer = 3 * min(chunk, tokens) * vocab * LOGITS_BYTES + tokens * shape.hidden * b
    split = layout.rollout_tensor_parallel > 1  # decoding on the tensor-parallel plan: this rank's heads and weights
    kv_cache = shape.layers * shape.cache_width * b * layout.max_sequence_length * layout.sequences_per_generate_call \
        // (tp if split else 1)
    whole = total + (adapters.parameters if adapters else 0)
    rollout_params = params if split else whole * b + (params if shards > 1 or expert_shards > 1 else 0)
    # FSDP2 inside pipeline stages keeps each stage's layers gathered through a pass and its gradients whole
    # until the schedule's end: the stage's whole parameters and gradients instead of their shards
    gathered = ((held + extra) * b // tp + trained * b // tp - params - grads
                if layout.pipeline_parallel > 1 and shards > tp else 0)
    update = params + grads + optimizer + reference + activations + output_layer + gathered
    per_expert_param = b + (0 if adapters else b + OPTIMIZER_BYTES) + (b if reference else 0)
    expert_states = routed_held * per_expert_param // expert_shards
    ex = moe_experts(config) if routed else None
    # dispatch + combine: each of a rank's tokens x k rows of h leaves it when its expert is elsewhere, (ep - 1) / ep
    # of them with a balanced router; the backward sends the gradients back the same way
    a2a = 2 * tokens * ex.per_token * shape.hidden * b * (ep - 1) // ep if ex is not None and ep > 1 else 0
    sparse_held = ex.layers * _layers_held(config, layout) // shape.layers if ex is not None else 0
    # the output layer multiplies by the embedding matrix when tied to it
    flops = 2 * (active - parts["embeddings"] - parts["norms"] + (parts["embeddings"] if shape.tied else 0)) \
        if parts else 0
    rollout = rollout_params + optimizer + reference + kv_cache
    where = " x ".join(part for part in (
        f"sharded over the {layout.data_parallel} data-parallel ranks (actor.strategy=fsdp2)"
        if layout.strategy == "fsdp2" and layout.data_parallel > 1 else "",
        f"split over the tensor-parallel group of {tp}" if tp > 1 else "",
        f"the routed experts {ex.experts // ep} of {ex.experts} per rank (actor.expert_parallel_size={ep})"
        + (f", each slice sharded over edp {edp}" if layout.strategy == "fsdp2" and edp > 1 else "")
        if ex is not None and ep > 1 else "") if part)
    count = f"{held:,} (this rank's stages, of {total:,})" if layout.pipeline_parallel > 1 else f"{total:,}"
    over = over_rest = f" / {shards}" if shards > 1 else ""
    if expert_shards != shards:  # expert parallel without FSDP2: the routed experts 1/ep, the rest whole
        count, over = f"({held - routed_held:,}{over} + {routed_held:,} routed experts / {expert_shards})", ""
    if adapters:
        ad = f"{extra:,} (this rank's stages, of {adapters.parameters:,})" if layout.pipeline_parallel > 1 \
            else f"{extra:,}"
        state_formulas = {
            "params": f"({count} frozen + {ad} adapters{over_rest if expert_shards != shards else ''}) x {b} B "
                      f"({cfg.model.dtype}){over}",
            "grads": f"the adapters only: {ad} x {b} B{over_rest}",
            "optimizer": f"AdamW over the adapters only: 2 x float32 = {OPTIMIZER_BYTES} B x {ad}{over_rest}",
            "reference": ("0: the base with the adapters off (actor.lora), no copy" if layout.reference_pass
                          else "algo.kl_coef=0: no reference model"),
        }
    else:
        state_formulas = {
            "params": f"{count} x {b} B ({cfg.model.dtype}){over}",
            "grads": f"{count} x {b} B, as the parameters{over}",
            "optimizer": f"AdamW: 2 x float32 = {OPTIMIZER_BYTES} B x {count}{over}",
            "reference": (f"parameters only, {count} x {b} B{over}"
                          if layout.reference_pass else "algo.kl_coef=0: no reference model"),
        }
    formulas = {
        **state_formulas,
        "model_states": "params + grads + optimizer + reference (what a run's perf/model_states_gb measures)",
        **_moe_formulas(config, layout, b, shards, routed, routed_held, per_expert_param, adapters is not None,
                        bool(reference), total, active, flops, tokens),
        "activations": (f"{tokens:,} tokens x {shape.layers} layers x (8 x {shape.hidden} + "
                        + (f"4 x {kv_width} + 4 x {shape.active_intermediate:g}" if tp == 1 else
                           f"(4 x {kv_width} + 4 x {shape.active_intermediate:g}) / tp {tp}")
                        + (f" + {lora_per_token_layer:,} of the adapters" if lora_per_token_layer else "")
                        + f") x {b} B; {ACTIVATION_FORMULA}"
                        + ("; the adapters: rank per adapted layer (A x), + its input with actor.lora.dropout"
                           if lora_per_token_layer else "")),
        "output_layer": f"3 x {min(chunk, tokens):,} rows x vocab {vocab:,}{f' (of {shape.vocab:,}, 1/{tp})' if tp > 1 else ''}"
                        f" x 4 B (one chunk of float32 logits, probabilities and their gradient) + the last hidden "
                        f"states",
        "kv_cache": ((f"{shape.layers} layers x {shape.cache_width} (MLA's latent: kv_lora_rank + qk_rope_head_dim, "
                      f"one per token for all heads) x {b} B x " if shape.model_type == "deepseek_v3" else
                      f"2 x {shape.layers} layers x {shape.kv_heads} kv heads x {shape.head_dim} x {b} B x ")
                     + f"{layout.max_sequence_length} tokens x {layout.sequences_per_generate_call} sequences per "
                     f"generate call" + (f" / {tp} (this rank's heads)" if split else "")),
        "rollout_params": ("this rank's split parameters (the native engine decodes on the tensor-parallel plan)"
                           if split else "the full parameters, gathered for generation, + the shard"
                           if shards > 1 or expert_shards > 1
                           else "the parameters"),
        "update_phase": "params + grads + optimizer + reference + activations + output layer" + (
            f" + the stages' whole parameters and gradients during a pass ({human_bytes(gathered)} beyond their "
            f"shards: FSDP2 inside pipeline stages gathers once per pass)" if gathered else ""),
        "rollout_phase": "full params + optimizer + reference + KV cache (gradients are freed after each update)",
        "shards": where or "not sharded" + (" (actor.strategy=ddp: a full replica per rank)"
                                            if layout.world_size > 1 else " (one rank)"),
    }
    leaves_out = [
        "the framework's own memory: the CUDA/NPU context and the allocator's cache and fragmentation "
        "(often 1-3 GiB per device)",
        "temporary buffers: attention kernels' workspaces, the optimizer step's temporaries, the rollout's "
        "per-token logits, and the forwards of the old-log-prob and reference passes (no stored activations)",
        "FSDP2's all-gather and reduce-scatter buffers (a layer or two of full parameters at a time)"
        if shards > 1 else "the gradient all-reduce's buffers (up to one more copy of the gradients)"
        if layout.world_size > 1 else "collective buffers (one rank: none)",
        "offload: actor.offload and ref.offload move states to the host between phases; the estimate "
        "keeps everything on the device",
        "packing and prompt sharing make real forwards shorter than the worst case counted here "
        "(every sequence at data.max_prompt_length + rollout.max_new_tokens)",
    ]
    if ex is not None and ep > 1:
        if layout.strategy == "fsdp2" and edp > 1:
            leaves_out.append(f"FSDP2's all-gather of a sparse layer's expert slice over the {edp} edp ranks holds "
                              f"its {ex.experts // ep} experts whole: "
                              f"{human_bytes(ex.experts // ep * 3 * shape.hidden * ex.intermediate * b)} per layer")
        leaves_out.append("the all-to-alls' buffers (the rows sent and received) and an unbalanced router: a rank "
                          "whose experts get more than 1/ep of the rows computes and keeps more; the experts "
                          "gathered whole for each generate call are counted in the rollout phase")
    elif ex is not None and shards > 1:
        leaves_out.append(f"FSDP2's all-gather of a sparse layer holds all its {ex.experts} experts whole: "
                          f"{human_bytes(ex.experts * 3 * shape.hidden * ex.intermediate * b)} per layer")
    if adapters:
        leaves_out.append("LoRA: the native engine's merged weights (W + scale x B A) laid out for each generate "
                          "call; and a frozen layer keeps less for the backward than the activations count (no "
                          "weight gradient needs its input)")
    return Memory(shape.model_type, total, parts, counted, cfg.model.dtype, b, shards, tokens, params, grads,
                  optimizer, reference, activations, output_layer, kv_cache, rollout_params, update, rollout,
                  max(update, rollout), formulas, leaves_out,
                  trained_parameters=adapters.parameters if adapters else total,
                  trained_share=adapters.parameters / whole if adapters else 1.0,
                  model_states=params + grads + optimizer + reference, adapters=adapters,
                  active_parameters=active, routed_parameters=routed, expert_states=expert_states,
                  flops_per_token=flops, expert_parallel=ep, experts_per_rank=ex.experts // ep if ex else 0,
                  expert_shards=expert_shards, all_to_all_forward=a2a, all_to_all_update=2 * a2a,
                  all_to_all_micro_batch=2 * a2a * sparse_held)


def make_plan(cfg: Config, source: str = "tiny", cores: Optional[int] = None,
              devices: Optional[tuple[str, int]] = None) -> Plan:
    """Every check `verirl train` runs before loading anything (names, paths, layout, devices), then
    the derived layout, resources and memory estimate. Raises `UserError` when a check fails."""
    from verirl.run.checks import check

    check(cfg, import_rules=False, devices=devices)  # a rule file is read, not run
    layout = make_layout(cfg)
    resources = make_resources(cfg, cores)
    config = read_model_config(cfg.model.path)
    memory, note = None, ""
    try:
        lora_adapters(cfg, config)  # actor.lora.target_modules against the model's linear layers (ConfigError)
    except EstimateUnavailable:
        pass  # its layers cannot be known from its config: the run's own check names them
    try:
        memory = estimate_memory(cfg, layout, config)
    except EstimateUnavailable as e:  # the checks passed; only the estimate is missing
        note = f"no memory estimate for model.path={cfg.model.path}: {e}"
    return Plan(source, cfg.model.path, layout, resources, memory, note)


# ---------------------------------------------------------------- text

def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_flops(n: float) -> str:
    """FLOPs in three significant digits: 6.71 GFLOP."""
    return human_count(n).replace("B", "G").replace("K", "k") + " FLOP" if n >= 1e3 else f"{n:.0f} FLOP"


def _mesh_rows(L: Layout) -> list[tuple[str, str, str]]:
    """The mesh and each rank's coordinates on it, when there is more than data parallelism."""
    tp, sp, pp, dp = L.tensor_parallel, L.sequence_parallel, L.pipeline_parallel, L.data_parallel
    ep, edp = L.expert_parallel, L.expert_data_parallel
    if tp * sp * pp == 1 and ep == 1:
        return []
    dims = [(name, size) for name, size in (("dp", dp), ("pp", pp), ("sp", sp), ("tp", tp)) if size > 1 or name == "dp"]
    shown = range(min(L.world_size, 8))
    coords = "; ".join(f"rank {r}: " + ", ".join(
        [f"{name} {L.coordinates(r)[name]}" for name, _ in dims]
        + ([f"{name} {L.expert_coordinates(r)[name]}" for name in ("edp", "ep")] if ep > 1 else [])) for r in shown)
    what = []
    if tp > 1:
        groups = ", ".join("[" + ", ".join(str(g * tp + j) for j in range(tp)) + "]"
                           for g in range(min(L.world_size // tp, 4)))
        what.append(f"tensor-parallel groups of consecutive ranks {groups}{', ...' if L.world_size // tp > 4 else ''} "
                    f"(one machine each: heads, MLP width and vocabulary 1/{tp} per rank)")
    if sp > 1:
        what.append(f"sequence-parallel groups of {sp} (each micro-batch's tokens 1/{sp} per rank, the heads "
                    f"exchanged around attention)")
    if pp > 1:
        what.append(f"pipelines of {pp} stages (decoder layers per rank, the tied embedding on both end stages)")
    if ep > 1:
        n = L.world_size // (tp * pp * ep)
        groups = ", ".join(f"[{g * ep}..{g * ep + ep - 1}]" for g in range(min(n, 4)))
        what.append(f"the dp x sp group of {dp * sp} laid out as (edp {edp}, ep {ep}), ep innermost: expert-parallel "
                    f"groups of {ep} consecutive data-parallel ranks {groups}{', ...' if n > 4 else ''} (E/ep "
                    f"routed experts per rank, tokens dispatched and combined by all-to-all); the {edp} edp ranks of "
                    f"an ep coordinate hold the same experts")
    sizes = " x ".join(f"actor.{k}_parallel_size {v}" for k, v in (("tensor", tp), ("sequence", sp), ("pipeline", pp))
                       if v > 1)
    rows = [("mesh", " x ".join(f"{name} {size}" for name, size in dims) + (f" (edp {edp} x ep {ep})" if ep > 1 else ""),
             f"world {L.world_size}" + (f" / {sizes}" if sizes else "") + "; " + "; ".join(what)
             + "; data and gradients over dp" + (" x sp" if sp > 1 else "")),
            ("coordinates", f"{L.world_size} ranks", coords + ("; ..." if L.world_size > 8 else ""))]
    if pp > 1:
        rows.append(("pipeline schedule", L.pipeline_schedule,
                     f"bubble {L.pipeline_bubble:.0%} of each pass ((p - 1) / (v m + p - 1) at the planned "
                     f"micro-batches); each micro-batch padded to actor.max_token_len_per_device between stages"))
    decode = (f"rollout.tensor_parallel_size {L.rollout_tensor_parallel}: each tensor-parallel group decodes together "
              f"on the tensor-parallel plan" if L.rollout_tensor_parallel > 1 else
              "rollout.tensor_parallel_size 1: each rank decodes a share of its data-parallel coordinate's prompts "
              "with the whole weights (gathered for the rollout)")
    rows.append(("rollout layout", f"tp {L.rollout_tensor_parallel}", decode))
    if L.launcher == "ray" and tp > 1:
        rows.append(("ray placement", f"{L.world_size // tp} bundles of {tp} ranks",
                     "one placement-group bundle per tensor-parallel group (its ranks' CPUs and devices): Ray "
                     "puts each group on one machine, so its per-layer all-reduces stay inside it"))
    return rows


def _trained(M: Memory) -> str:
    """How the parameters trained are counted: every one, or the LoRA adapters layer by layer."""
    A = M.adapters
    if A is None:
        return "every parameter (actor.lora.rank 0: full-parameter training)"
    parts = ", ".join(f"{name} {n:,}" for name, n in A.by_module.items())
    layers = f"{A.layers} linear layer{'' if A.layers == 1 else 's'}"
    return (f"LoRA adapters: rank {A.rank} x (in + out) for each of {layers} ({parts}; counted by {A.counted}); "
            f"{M.trained_share:.2%} of the {M.parameters + A.parameters:,} parameters, the base frozen")


def _rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(section or label, value, how it is counted); a row with an empty value and how is a heading."""
    L, R, M = plan.layout, plan.resources, plan.memory
    s = lambda k, one, many: f"{k} {one if k == 1 else many}"  # noqa: E731
    alone = L.tensor_parallel * L.sequence_parallel * L.pipeline_parallel == 1
    ranks = f"/ world size {L.world_size}" if alone else f"/ data-parallel size {L.data_parallel}"
    rows = [("layout", "", ""),
            ("world size", f"{L.world_size}",
             f"trainer.nproc_per_node {L.nproc_per_node} x trainer.nnodes {L.nnodes}"
             + (f" - rollout.nproc {L.producers} producers" if L.producers else "") + f"; launcher {L.launcher}; "
             + (f"actor.strategy {L.strategy}" if L.world_size > 1 else "one rank, no data parallelism")),
            *([("producers", f"{L.producers}",
                f"rollout.placement separate: they generate and score while the trainers update, samples at most "
                f"{L.max_staleness} version{'' if L.max_staleness == 1 else 's'} old (mode {L.async_mode}; "
                f"docs/async.md)")] if L.producers else []),
            *_mesh_rows(L),
            ("prompts per step", f"{L.prompts_per_step}", "data.prompts_per_step (counts prompts)"),
            ("prompts per rank", f"{L.prompts_per_rank}",
             f"{L.prompts_per_step} {ranks}, whole groups (all rollout.n samples of a prompt on one rank)"
             if alone else
             f"{L.prompts_per_step} / data-parallel size {L.data_parallel}, whole groups; the ranks of one "
             f"data-parallel coordinate hold the same prompts"),
            ("sequences per step", f"{L.sequences_per_step}",
             f"{L.prompts_per_step} prompts x rollout.n {L.group_size}"),
            ("sequences per rank", f"{L.sequences_per_rank}",
             f"{L.prompts_per_rank} prompts x rollout.n {L.group_size}"),
            ("mini-batches per step", f"{L.mini_batches_per_step}",
             f"data.prompts_per_step {L.prompts_per_step} / actor.mini_batch_prompts {L.mini_batch_prompts}"),
            ("optimizer steps per step", f"{L.optimizer_steps_per_step}",
             f"{s(L.mini_batches_per_step, 'mini-batch', 'mini-batches')} x actor.epochs {L.epochs}"),
            ("mini-batch per rank", f"{L.mini_batch_sequences_per_rank} seq",
             f"actor.mini_batch_prompts {L.mini_batch_prompts} {ranks} = {L.mini_batch_prompts_per_rank} prompts "
             f"x rollout.n {L.group_size}")]
    if L.token_budget > 0:
        rows.append(("token budget per forward", f"{L.token_budget:,} tok",
                     f"actor.max_token_len_per_device, per rank; at most "
                     f"{s(L.micro_batches_per_mini_batch, 'micro-batch', 'micro-batches')} per mini-batch "
                     f"(when every sequence is {L.max_sequence_length} tokens long)"))
    else:
        rows.append(("micro-batches per mini-batch", f"{L.micro_batches_per_mini_batch}",
                     f"ceil({L.mini_batch_sequences_per_rank} sequences / actor.micro_batch_size "
                     f"{L.micro_batch_size}), per rank"))
    if L.old_log_prob_pass:
        why = (f"{L.mini_batches_per_step} mini-batches per step" if L.mini_batches_per_step > 1
               else f"actor.epochs {L.epochs}")
        rows.append(("old-log-prob pass", "runs",
                     f"off-policy ({why}): {'at most ' if L.token_budget else ''}"
                     f"{s(L.old_log_prob_micro_batches, 'micro-batch', 'micro-batches')} per rank per step"))
    else:
        rows.append(("old-log-prob pass", "skipped",
                     "on-policy: one mini-batch per step and one epoch, the update's own log-probs are the old ones"))
    if L.reference_pass:
        budget = (f"a budget of {L.ref_token_budget:,} tokens, at most "
                  f"{s(L.ref_micro_batches, 'micro-batch', 'micro-batches')}" if L.ref_token_budget else
                  f"{s(L.ref_micro_batches, 'micro-batch', 'micro-batches')} of <= {L.micro_batch_size} sequences")
        rows.append(("reference pass", "runs", f"algo.kl_coef > 0: {budget} per rank per step"
                     + ("; the actor with its LoRA adapters off (no second model)" if L.lora_rank else "")))
    else:
        rows.append(("reference pass", "skipped", "algo.kl_coef 0: no reference model, no KL term"))
    rows.append(("generate calls per rank", f"{L.generate_calls_per_rank}",
                 f"of {L.sequences_per_generate_call} sequences (rollout.micro_batch_size, whole groups; "
                 f"0 = all at once)"))
    rows += [("resources per rank", "", ""),
             ("threads", f"{R.threads_per_rank}", R.threads_from),
             ("reward workers", f"{R.reward_workers_per_rank}", R.reward_workers_from)]
    if R.local_ranks * R.threads_per_rank > R.cores:
        rows.append(("", "", f"note: {R.local_ranks} local ranks x {R.threads_per_rank} threads > {R.cores} cores: "
                             f"oversubscribed, lower trainer.threads"))
    if M is None:
        rows += [("memory per rank", "", ""), ("", "", plan.memory_note)]
        return rows
    f = M.formulas
    moe = (f"; {human_count(M.parameters)} total, {human_count(M.active_parameters)} active per token"
           if M.routed_parameters else "")
    rows += [("memory per rank", "", f"an ESTIMATE from config.json ({M.model_type}, {M.parameters:,} parameters "
                                     f"counted by {M.counted}{moe}), not a measurement; {f['shards']}"),
             *([("active parameters per token", human_count(M.active_parameters), f["size"])]
               if M.routed_parameters else []),
             *([("FLOPs per token", human_flops(M.flops_per_token), f["flops"])] if M.flops_per_token else []),
             ("parameters trained", f"{M.trained_parameters:,}", _trained(M)),
             ("parameters", human_bytes(M.params), f["params"]),
             ("gradients", human_bytes(M.grads), f["grads"]),
             ("optimizer state", human_bytes(M.optimizer), f["optimizer"]),
             ("reference model", human_bytes(M.reference), f["reference"]),
             ("model states", human_bytes(M.model_states), f["model_states"]),
             *([("routed experts' states", human_bytes(M.expert_states), f["experts"])] if M.routed_parameters else []),
             *([("all-to-all per sparse layer", human_bytes(M.all_to_all_forward), f["all_to_all"]),
                ("all-to-all per micro-batch", human_bytes(M.all_to_all_micro_batch), f["all_to_all_micro_batch"])]
               if M.all_to_all_forward else []),
             ("activations", human_bytes(M.activations), f["activations"]),
             ("output layer", human_bytes(M.output_layer), f["output_layer"]),
             ("rollout KV cache", human_bytes(M.kv_cache), f["kv_cache"]),
             ("update phase", human_bytes(M.update_phase), f["update_phase"]),
             ("rollout phase", human_bytes(M.rollout_phase), f["rollout_phase"] + "; params: " + f["rollout_params"]),
             ("peak (estimate)", human_bytes(M.peak), "the larger of the two phases")]
    rows += [("", "", "the estimate leaves out:")] + [("", "", "- " + w) for w in M.leaves_out]
    return rows


def render(plan: Plan) -> str:
    """The plan as aligned text: label, value, how it is counted."""
    head = [f"verirl plan: --config {plan.source}, model.path={plan.model_path}",
            "checks passed: names, paths, run directory, model directory (doctor), batch shapes, layout, devices "
            "(nothing loaded, nothing written)"]
    out = []
    for label, value, how in _rows(plan):
        if not value and not how:
            out += ["", label]
        elif not value and not label:
            out.append(f"  {'':<30} {'':>12}  {how}")
        elif not value:
            out += ["", f"{label}: {how}"]
        else:
            out.append(f"  {label:<30} {value:>12}  {how}")
    return "\n".join(head + out) + "\n"
