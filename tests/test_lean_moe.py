"""The native engine's lean decoder on Qwen3 and the MoE families (Qwen3-MoE, Qwen2-MoE, Mixtral) against
transformers' own forward, ``generate`` and routers, on small models with random weights."""
import pytest
import torch

from verirl.rollout import HFEngine, NativeEngine, SamplingParams
from verirl.rollout.base import left_pad
from verirl.rollout.lean import LeanDecoder, lean_supported
from verirl.rollout.native import _LeanStepper

V, PAD, EOS = 97, 0, 3
COMMON = dict(vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=128, initializer_range=0.1, pad_token_id=PAD, eos_token_id=EOS,
              bos_token_id=1)


def _config(family: str):
    import transformers as T

    if family == "qwen3":
        return T.Qwen3Config(intermediate_size=96, attention_bias=True, **COMMON)
    if family == "qwen3_moe":  # layer 1 dense (mlp_only_layers), 0 and 2 sparse
        return T.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                norm_topk_prob=True, mlp_only_layers=[1], **COMMON)
    if family == "qwen3_moe_step":  # decoder_sparse_step 2: layer 1 sparse, 0 and 2 dense; weights not renormalised
        return T.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                norm_topk_prob=False, decoder_sparse_step=2, **COMMON)
    if family == "qwen2_moe":  # a shared expert with its sigmoid gate, q/k/v biases
        return T.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, **COMMON)
    if family == "mixtral":
        return T.MixtralConfig(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **COMMON)
    raise ValueError(family)


_MODELS: dict = {}


def model_of(family: str):
    """A small model of ``family`` with random weights (its norms' weights moved off 1, so that the q/k norms
    and every RMSNorm weight count), in eval mode, built once per session."""
    from transformers import AutoModelForCausalLM

    if family not in _MODELS:
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(_config(family)).eval()
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.add_(0.2 * torch.randn_like(p))
        _MODELS[family] = m
    return _MODELS[family]


def _prompts(seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=g).tolist() for n in (3, 9, 14)]


FAMILIES = ["qwen3", "qwen3_moe", "qwen3_moe_step", "qwen2_moe", "mixtral"]


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_logits_and_greedy_equal_transformers(family):
    """float32: the lean prefill's last logits equal transformers' forward within 1e-5, and greedy decoding
    through the native engine (which takes the lean decoder) gives transformers' generate's tokens."""
    from verirl.models.moe import moe_blocks

    model = model_of(family)
    assert lean_supported(model)
    if family != "qwen3":  # the dense layers of a MoE config stay dense
        sparse = [i for i, _ in moe_blocks(model)]
        assert sparse == {"qwen3_moe": [0, 2], "qwen3_moe_step": [1]}.get(family, [0, 1, 2])
    ids, mask = left_pad(_prompts(), PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        ours = _LeanStepper(model).prefill(ids, mask, pos, ids.shape[1] + 4)
    assert theirs.abs().max() > 1.0  # logits large enough for the bound to mean something
    assert (ours - theirs).abs().max() < 1e-5
    params = SamplingParams(max_new_tokens=12, temperature=0)
    eng = NativeEngine(model, PAD, [EOS])
    a = eng.generate(_prompts(), 2, params)
    assert isinstance(eng.decoder, LeanDecoder)
    b = HFEngine(model, PAD, [EOS]).generate(_prompts(), 2, params)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)


def test_one_shape_steps_equal_generate(monkeypatch):
    """The decoding step a CUDA graph captures (one shape, the whole cache attended, no compaction), run
    eagerly here on a MoE model: transformers' generate's greedy tokens."""
    import verirl.rollout.native as native

    monkeypatch.setattr(native, "_one_shape", lambda device: (True, False))
    model = model_of("qwen2_moe")
    params = SamplingParams(max_new_tokens=12, temperature=0)
    a = NativeEngine(model, PAD, [EOS]).generate(_prompts(7), 2, params)
    b = HFEngine(model, PAD, [EOS]).generate(_prompts(7), 2, params)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)


def test_experts_are_views_of_the_fused_weights():
    """The sparse layers compute on the experts' own 3-D parameters (no copy per generate call)."""
    from verirl.rollout.lean import _Dense, _Moe

    model = model_of("qwen2_moe")
    dec = LeanDecoder(model)
    for layer, L in zip(model.model.layers, dec.layers):
        assert isinstance(L.mlp, _Moe)
        assert L.mlp.w_gu.data_ptr() == layer.mlp.experts.gate_up_proj.data_ptr()
        assert L.mlp.w_d.data_ptr() == layer.mlp.experts.down_proj.data_ptr()
        assert isinstance(L.mlp.shared, _Dense)
    assert isinstance(LeanDecoder(model_of("qwen3_moe")).layers[1].mlp, _Dense)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_native_engine_logprobs_equal_the_trainers(family):
    """Seeded sampling with a MoE model: the engine decodes through the lean decoder, and its sampled
    tokens' log-probs equal the trainer's log-prob pass over the same rollout (packed rows) within 1e-5."""
    from verirl.train.update import compute_logprobs

    model = model_of(family)
    eng = NativeEngine(model, PAD, [EOS])
    roll = eng.generate(_prompts(5), 3, SamplingParams(max_new_tokens=16, temperature=1.0, seed=3))
    assert isinstance(eng.decoder, LeanDecoder)
    lp = compute_logprobs(model, roll)
    m = roll.response_mask.bool()
    assert m.sum() > 60
    assert (roll.sample_logprobs - lp)[m].abs().max() < 1e-5


def _router_ids(model, ids, mask, pos) -> list[torch.Tensor]:
    """transformers' router top-k ids per sparse layer (B, T, k) of a forward over ids."""
    from verirl.models.moe import moe_blocks

    got, hooks = [], []
    for _, block in moe_blocks(model):
        hooks.append(block.gate.register_forward_hook(lambda mod, inp, out: got.append(out[2])))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos)
    finally:
        for h in hooks:
            h.remove()
    return [g.view(ids.shape[0], ids.shape[1], -1) for g in got]


def _lean_routes(model, steps: int, monkeypatch, noise=None):
    """The lean decoder's recorded routes over a prefill and ``steps`` greedy steps: (B, P + steps, k) per
    sparse layer, with the tokens and the mask of the whole sequences."""
    monkeypatch.setattr(LeanDecoder, "record_routes", True)
    monkeypatch.setattr(LeanDecoder, "route_noise", noise)
    ids, mask = left_pad(_prompts(), PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    run = _LeanStepper(model)
    with torch.no_grad():
        logits = run.prefill(ids, mask, pos, ids.shape[1] + steps)
        routes = [[r.clone()] for r in run.dec.last_routes]
        nxt = pos[:, -1] + 1
        for t in range(steps):
            tok = logits.argmax(-1)
            ids, mask = torch.cat([ids, tok[:, None]], 1), torch.cat([mask, torch.ones_like(tok)[:, None]], 1)
            logits = run.step(tok, nxt, ids.shape[1] - 1)
            nxt = nxt + 1
            for acc, r in zip(routes, run.dec.last_routes):
                acc.append(r.clone())
    return [torch.cat(r, 1) for r in routes], ids, mask


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_recorded_routes_equal_the_routers(family, monkeypatch):
    """record_routes: each sparse layer's chosen experts, per token of the prefill and of each decoding
    step, equal transformers' router top-k over the same tokens (real tokens; pads are not compared)."""
    model = model_of(family)
    routes, ids, mask = _lean_routes(model, 4, monkeypatch)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    theirs = _router_ids(model, ids, mask, pos)
    assert len(routes) == len(theirs) == (2 if family == "qwen3_moe" else 3)
    real = mask.bool()
    for ours, ref in zip(routes, theirs):
        assert ours.shape == ref.shape and ours.dtype == torch.long
        assert torch.equal(ours.sort(-1)[0][real], ref.sort(-1)[0][real])
    assert len({tuple(r) for r in routes[0][real].tolist()}) > 3  # the routers do choose among the experts


def test_route_noise_changes_the_routes_seeded(monkeypatch):
    """route_noise perturbs the routers' logits before the choice: the routes differ from the model's own
    for some tokens, and a decoder of the same route_seed draws the same noise."""
    model = model_of("qwen3_moe")
    plain, _, mask = _lean_routes(model, 3, monkeypatch)
    noisy, _, _ = _lean_routes(model, 3, monkeypatch, noise=1.0)
    again, _, _ = _lean_routes(model, 3, monkeypatch, noise=1.0)
    real = mask.bool()
    differ = torch.stack([(a.sort(-1)[0] != b.sort(-1)[0]).any(-1)[real] for a, b in zip(plain, noisy)])
    assert 0.1 < differ.float().mean() < 1.0
    assert all(torch.equal(a, b) for a, b in zip(noisy, again))


def test_not_lean():
    """DeepSeek-V3 (MLA attention) and a sliding-window Qwen3-MoE decode through transformers' forward."""
    import transformers as T

    ds = T.DeepseekV3Config(vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                            q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
    torch.manual_seed(0)
    assert not lean_supported(T.DeepseekV3ForCausalLM(ds))
    windowed = T.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                use_sliding_window=True, sliding_window=8, **COMMON)
    assert not lean_supported(T.Qwen3MoeForCausalLM(windowed))


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_saved_by_save_pretrained_load_back_under_the_models_names(family, tmp_path):
    """What a whole checkpoint holds (save_pretrained's names: each expert's own matrices, Mixtral's under
    ``block_sparse_moe`` as w1 / w2 / w3) read back through `shard_state_dict`, as a resume reads it: every
    weight of a fresh model equal to the saved model's, no key missing or left over."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from verirl.train.strategy import shard_state_dict

    model = model_of(family)
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    fresh = AutoModelForCausalLM.from_config(_config(family))
    fresh.load_state_dict(shard_state_dict(fresh, saved), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
