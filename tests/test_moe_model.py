"""MoE families (verirl.models.moe) against transformers' own routers and layer rules, parameter counts by
hand, and the shipped tiny-moe model: it loads and trains."""
from __future__ import annotations

import pytest
import torch
from transformers import (DeepseekV3Config, MixtralConfig, OlmoeConfig, Qwen2Config, Qwen2MoeConfig,
                          Qwen3MoeConfig)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from verirl.core.errors import ModelError
from verirl.models.moe import SIGMOID_GROUP, SOFTMAX, active_parameters, moe_blocks, reweight, route, routing

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def _check_router(router_cls, config, bias: bool = False):
    torch.manual_seed(0)
    router = router_cls(config)
    torch.nn.init.normal_(router.weight, std=1.0)
    if bias:
        router.e_score_correction_bias.normal_(std=0.5)
    h = torch.randn(257, config.hidden_size)
    logits, hf_w, hf_ids = router(h)
    r = routing(config)
    w, ids = route(logits, r, router.e_score_correction_bias if bias else None)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32 and w.shape == (257, r.top_k)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(w, hf_w.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(reweight(logits, ids, r), w, rtol=0, atol=1e-7)
    return r, ids


@pytest.mark.parametrize("norm", [True, False])
def test_qwen_routers(norm):
    for cfg_cls, router_cls in [(Qwen3MoeConfig, Qwen3MoeTopKRouter), (Qwen2MoeConfig, Qwen2MoeTopKRouter)]:
        cfg = cfg_cls(**SMALL, num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm)
        r, _ = _check_router(router_cls, cfg)
        assert r == routing(cfg) and r.family == SOFTMAX and r.norm_topk_prob is norm and r.num_experts == 8


def test_mixtral_router_always_renormalises():
    cfg = MixtralConfig(**SMALL, num_local_experts=6, num_experts_per_tok=2)
    r, _ = _check_router(MixtralTopKRouter, cfg)
    assert r.family == SOFTMAX and r.norm_topk_prob and r.num_experts == 6


@pytest.mark.parametrize("norm", [True, False])
def test_deepseek_v3_router_groups_bias_scaling(norm):
    cfg = DeepseekV3Config(**SMALL, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                           routed_scaling_factor=2.5, norm_topk_prob=norm)
    r, ids = _check_router(DeepseekV3TopkRouter, cfg, bias=True)
    assert (r.family, r.n_group, r.topk_group, r.scaling) == (SIGMOID_GROUP, 4, 2, 2.5)
    # every token's experts lie in at most topk_group groups
    assert max(len(set((row // 4).tolist())) for row in ids) <= 2


def test_dense_and_unknown_families():
    assert routing(Qwen2Config(**{k: v for k, v in SMALL.items() if k != "moe_intermediate_size"})) is None
    assert routing(Qwen3MoeConfig(**SMALL, num_experts=0)) is None
    with pytest.raises(ModelError, match="olmoe.*supported MoE families: deepseek_v3, mixtral, qwen2_moe"):
        routing(OlmoeConfig(num_experts=8))


def _layers(config) -> list[int]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(config)
    return [i for i, _ in moe_blocks(model)]


def test_moe_blocks_find_the_sparse_layers():
    assert _layers(Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1])) == [0, 2, 3]
    assert _layers(Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2,
                                  shared_expert_intermediate_size=16)) == [1, 3]
    assert _layers(MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)) == [0, 1, 2, 3]
    assert _layers(DeepseekV3Config(**SMALL, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                    first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
                                    qk_nope_head_dim=4, v_head_dim=8)) == [1, 2, 3]
    assert _layers(Qwen2Config(**{k: v for k, v in SMALL.items() if k != "moe_intermediate_size"})) == []


def _qwen3_moe_by_hand(V, H, L, E, k, I, heads, kv, hd, tied) -> tuple[int, int]:
    attn = H * heads * hd + 2 * H * kv * hd + heads * hd * H + 2 * hd  # q, k, v, o, q_norm, k_norm
    expert = 3 * H * I  # gate, up, down
    other = L * (attn + 2 * H + E * H) + H + V * H * (1 if tied else 2)  # norms, router; final norm; embeddings
    return other + L * k * expert, other + L * E * expert


def test_active_parameters_tiny_moe():
    from transformers import AutoTokenizer
    from verirl.models.load import TINY_DIR
    from verirl.models.tiny import moe_config
    tiny = moe_config(AutoTokenizer.from_pretrained(TINY_DIR))  # tiny-moe shares tiny's tokenizer
    assert (tiny.num_experts, tiny.num_experts_per_tok, tiny.moe_intermediate_size) == (8, 2, 128)
    assert active_parameters(tiny) == _qwen3_moe_by_hand(tiny.vocab_size, 128, 4, 8, 2, 128, 4, 2, 32, True)


def test_active_parameters_qwen3_30b_a3b():
    big = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_experts=128,
                         num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
                         num_attention_heads=32, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False)
    active, total = active_parameters(big)
    assert (active, total) == _qwen3_moe_by_hand(151936, 2048, 48, 128, 8, 768, 32, 4, 128, False)
    assert 30.4e9 < total < 30.6e9 and 3.3e9 < active < 3.4e9


def test_tiny_moe_loads_and_is_the_built_shape():
    from verirl.models.load import load_model
    from verirl.models.tiny import moe_config
    lm = load_model("tiny-moe")
    assert lm.model.config.model_type == "qwen3_moe" and lm.model.config._experts_implementation == "grouped_mm"
    built, shipped = moe_config(lm.tokenizer), lm.model.config
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                "tie_word_embeddings", "mlp_only_layers", "decoder_sparse_step"):
        assert getattr(shipped, key) == getattr(built, key), key
    assert [i for i, _ in moe_blocks(lm.model)] == [0, 1, 2, 3]
    assert lm.stop_ids == [0, 2]
    # the experts are trained, not the random init: they differ from one another and from build_moe_model's
    w = moe_blocks(lm.model)[0][1].experts.gate_up_proj
    assert w.shape == (8, 256, 128) and (w[0] - w[1]).abs().max() > 1e-3


def test_tiny_moe_recipe_trains_two_steps(tmp_path):
    import json
    from transformers import AutoModelForCausalLM
    from verirl.cli import main
    from verirl.models.load import TINY_MOE_DIR
    run = tmp_path / "run"
    # the entropy bonus gives every step a gradient, whatever the groups' rewards
    rc = main(["train", "--config", "tiny_moe", f"trainer.run_dir={run}", "trainer.total_steps=2",
               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=16",
               "algo.entropy_coef=0.01", "eval.before_train=false", "eval.at_end=false", "log.progress=false"])
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)
    before = AutoModelForCausalLM.from_pretrained(TINY_MOE_DIR)
    after = AutoModelForCausalLM.from_pretrained(run / "final")
    for (_, a), (_, b) in zip(moe_blocks(before), moe_blocks(after)):  # the update reached router and experts
        assert not torch.equal(a.gate.weight, b.gate.weight)
        assert not torch.equal(a.experts.gate_up_proj, b.experts.gate_up_proj)
        assert not torch.equal(a.experts.down_proj, b.experts.down_proj)


def test_perf_flops_count_the_experts_a_token_visits():
    """perf/mfu's matmul weights for tiny-moe: the nn.Linear ones (attention, the tied output layer) plus, per
    sparse layer, the router (8 x 128) and top-2 of the 8 experts (gate/up 256 x 128, down 128 x 128 each)."""
    from verirl.models.load import load_model
    from verirl.models.perf import FlopModel

    model = load_model("tiny-moe", "float32", "cpu").model
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert FlopModel.of(model).matmul_params == linear + 4 * (8 * 128 + 2 * (256 * 128 + 128 * 128))
