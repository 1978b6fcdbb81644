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
