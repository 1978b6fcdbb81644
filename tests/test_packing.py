"""Padding-free passes: packed log-probs equal the padded ones; token budgets are kept and exact."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verirl.config import ConfigError, load_config
from verirl.core.ops import varlen
from verirl.core.ops.head_logprobs import head_logprobs
from verirl.rollout.base import left_pad
from verirl.train.update import (LogprobPass, UpdateParams, build_optimizer, plan_micro_batches, response_logprobs,
                                sequence_logprobs, update_policy)
from verirl.train.packing import pack_rows, packed_logprobs
from verirl.core.types import Rollout, TrainBatch


def _rollout(prompts, responses, pad=0):
    """A Rollout from explicit token lists (responses right-padded, mask by length)."""
    p_ids, p_mask = left_pad(prompts, pad)
    R = max(max(len(r) for r in responses), 1)
    r_ids = torch.full((len(responses), R), pad)
    r_mask = torch.zeros((len(responses), R), dtype=torch.long)
    for i, r in enumerate(responses):
        r_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        r_mask[i, :len(r)] = 1
    return Rollout(p_ids, p_mask, r_ids, r_mask, r_mask.clone(), torch.ones(len(responses), dtype=torch.bool))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_equal_padded(tiny, sampled, share, temperature):
    rows = list(range(sampled.response_ids.shape[0]))
    a, ea, ma = response_logprobs(tiny.model, sampled, rows, temperature, with_entropy=True)
    b, eb, mb = packed_logprobs(tiny.model, sampled, rows, temperature, with_entropy=True, share_prompt=share)
    assert torch.equal(ma, mb)
    m = ma.bool()
    assert (a - b)[m].abs().max() <= 1e-5
    assert (ea - eb)[m].abs().max() <= 1e-4
    assert (b[~m] == 0).all()


def test_packed_gradient_equals_padded(tiny, sampled):
    def grads(fn):
        model = copy.deepcopy(tiny.model)
        lp, ent, mask = fn(model)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        return {n: p.grad for n, p in model.named_parameters()}

    rows = list(range(16))
    ga = grads(lambda m: response_logprobs(m, sampled, rows, with_entropy=True))
    gb = grads(lambda m: packed_logprobs(m, sampled, rows, with_entropy=True, share_prompt=True, chunk=7))
    for n in ga:  # float32 sums over a few hundred tokens: compare to the tensor's scale
        assert (ga[n] - gb[n]).abs().max() <= 1e-5 * ga[n].abs().max() + 1e-6, n


def test_small_segment_attention_equals_sdpa(tiny, sampled, monkeypatch):
    """The matmul path for short segments and SDPA's kernel: the same gradients, in float64."""
    import verirl.core.ops.attention as attention

    def grads(small):
        monkeypatch.setattr(attention, "SMALL_SEGMENT", small)
        model = copy.deepcopy(tiny.model).double()
        lp, ent, mask = packed_logprobs(model, sampled, list(range(16)), with_entropy=True, chunk=7)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    (la, ga), (lb, gb) = grads(0), grads(1 << 30)
    assert (la - lb).abs().max() <= 1e-12
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 1e-10 * (1 + ga[n].abs().max()), n


def test_shared_prompt_is_computed_once(sampled):
    pb = pack_rows(sampled, list(range(16)), share_prompt=True)
    plain = pack_rows(sampled, list(range(16)), share_prompt=False)
    p, r = sampled.prompt_lengths, sampled.response_lengths
    assert pb.input_ids.shape[1] == int(p[::4].sum() + r.sum())  # 4 prompts, each once
    assert plain.input_ids.shape[1] == int(p.sum() + r.sum())  # no pad token anywhere
    # positions restart at 0 for each prompt and run on through each of its responses
    assert pb.position_ids[0, 0] == 0 and int(pb.position_ids.max()) == int((p + r).max()) - 1


def test_packing_on_a_llama_model_with_odd_shapes():
    """Llama architecture (SmolLM2's), GQA 6:2 heads, an empty response, a one-token prompt."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    rnd = lambda n: torch.randint(1, 97, (n,), generator=g).tolist()  # noqa: E731
    prompts = [rnd(9), rnd(9), [5], rnd(30), rnd(30)]
    responses = [rnd(4), rnd(11), rnd(6), [], rnd(40)]
    roll = _rollout(prompts, responses)
    rows = list(range(5))
    a, _, ma = response_logprobs(model, roll, rows)
    for share in (True, False):
        b, _, mb = packed_logprobs(model, roll, rows, share_prompt=share)
        assert torch.equal(ma, mb)
        assert (a - b)[ma.bool()].abs().max() <= 1e-5


def test_chunked_head_equals_full_softmax_with_gradient():
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (37,))
    for t in (1.0, 0.6):
        lp, ent = head_logprobs(h, w, y, b, temperature=t, chunk=8, with_entropy=True)
        z = (h @ w.T + b) / t
        ref_lp = torch.log_softmax(z, -1).gather(-1, y[:, None]).squeeze(-1)
        ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
        assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(ent.double(), ref_ent, atol=1e-5)
    # float64 through the custom backward (both outputs used): torch's gradcheck against finite differences
    assert torch.autograd.gradcheck(lambda h_, w_, b_: head_logprobs(h_, w_, y, b_, 0.8, 5, True), (h, w, b))
    # only log-probs used (entropy for metrics): the backward skips the entropy term
    assert torch.autograd.gradcheck(lambda h_, w_: head_logprobs(h_, w_, y, None, 1.0, 6, False)[0], (h, w))


def test_token_budget_is_never_exceeded_and_covers_every_row(sampled):
    p, r = sampled.prompt_lengths.tolist(), sampled.response_lengths.tolist()
    rows = list(range(16))
    for share in (True, False):
        for budget in (max(p) + max(r), 60, 97, 150, 400):
            plan = plan_micro_batches(sampled, rows, 0, budget, share)
            assert sorted(i for mb in plan for i in mb) == rows  # each row exactly once
            for mb in plan:
                tokens = sum(r[i] for i in mb) + (
                    sum({tuple(sampled.prompt_ids[i, -p[i]:].tolist()): p[i] for i in mb}.values()) if share
                    else sum(p[i] for i in mb))
                assert tokens <= budget, (share, budget, mb, tokens)
                if share:  # the packed row holds exactly those tokens
                    assert pack_rows(sampled, mb, True).input_ids.shape[1] == tokens
            if not share and budget == 400:  # small items: the fewest bins the total allows, balanced
                total = sum(p) + sum(r)
                assert len(plan) == -(-total // budget)
                loads = [sum(p[i] + r[i] for i in mb) for mb in plan]
                assert max(loads) - min(loads) <= max(p[i] + r[i] for i in rows)
    with pytest.raises(ValueError, match="max_token_len_per_device"):
        plan_micro_batches(sampled, rows, 0, 10, True)


@pytest.mark.parametrize("share,padded", [(True, False), (False, False), (False, True)])
def test_token_budget_gives_the_full_batch_gradient(tiny, sampled, share, padded):
    batch = TrainBatch(sampled, torch.linspace(-1, 1, 16))

    def grads(micro, budget):
        model = copy.deepcopy(tiny.model)
        opt, sched = build_optimizer(model, 0.0, (0.9, 0.99), 0.0, 0)
        how = LogprobPass(micro_batch_size=micro, max_tokens=budget, remove_padding=not padded, share_prompt=share)
        p = UpdateParams(group_size=4, mini_batch_prompts=4, forward=how, grad_clip=0.0, entropy_coef=0.01)
        stats = update_policy(model, opt, sched, batch, p)
        return {n: q.grad.clone() for n, q in model.named_parameters()}, stats

    full, s_full = grads(16, 0)
    part, s_part = grads(16, 80)  # several micro-batches under an 80-token budget
    for n in full:
        assert torch.allclose(full[n], part[n], atol=1e-6, rtol=1e-4), n
    assert s_part["actor/pg_loss"] == pytest.approx(s_full["actor/pg_loss"], abs=1e-6)


def test_sequence_logprobs_falls_back_to_padded_when_asked(tiny, sampled):
    a, _, m = sequence_logprobs(tiny.model, sampled, [0, 5], LogprobPass(remove_padding=False))
    b, _, _ = sequence_logprobs(tiny.model, sampled, [0, 5])
    assert (a - b)[m.bool()].abs().max() <= 1e-5
    assert (a != b)[~m.bool()].any()  # the padded path computed (masked) values on pads: it really ran


def test_budget_smaller_than_a_sequence_is_refused_at_config_time():
    with pytest.raises(ConfigError, match="at least 160"):
        load_config(None, ["data.max_prompt_length=128", "rollout.max_new_tokens=32",
                           "actor.max_token_len_per_device=100"])


def _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
    """flash-attn's flash_attn_varlen_func, written out: q (Nq, H, d), k/v (Nk, KVH, d); segment s is
    q[cu_q[s]:cu_q[s+1]] against k[cu_k[s]:cu_k[s+1]]; causal aligned to the bottom-right corner."""
    assert dropout_p == 0.0 and cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    H, KVH = q.shape[1], k.shape[1]
    out = []
    for s in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[s]:cu_q[s + 1]], k[cu_k[s]:cu_k[s + 1]], v[cu_k[s]:cu_k[s + 1]]
        assert len(qs) <= max_q and len(ks) <= max_k
        ks, vs = ks.repeat_interleave(H // KVH, 1), vs.repeat_interleave(H // KVH, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        if causal:
            Q, K = len(qs), len(ks)
            allowed = torch.arange(K)[None, :] <= torch.arange(Q)[:, None] + (K - Q)
            scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs))
    return torch.cat(out)


@pytest.mark.parametrize("share", [True, False])
def test_varlen_call_arguments_describe_the_buckets_attention(tiny, sampled, monkeypatch, share):
    """The layout packed attention hands a varlen kernel (queries, gathered keys, cu_q / cu_k, max_q / max_k,
    causal) describes the same attention as the buckets: the kernel here is `_varlen_reference`, written
    out from flash-attn's semantics. The real kernels run on CUDA only: `test_cuda_varlen_kernel_equals_buckets`
    (bench/gpu_all.sh, part varlen)."""
    import verirl.train.packing as packing

    def run(fn):
        monkeypatch.setattr(packing, "varlen_kernel", lambda query, dropout=0.0: fn)
        model = copy.deepcopy(tiny.model)
        lp, ent, mask = packed_logprobs(model, sampled, list(range(16)), with_entropy=True, share_prompt=share)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    (la, ga), (lb, gb) = run(None), run(_varlen_reference)
    assert (la - lb).abs().max() <= 1e-5
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 1e-5 * ga[n].abs().max() + 1e-6, n


@pytest.mark.parametrize("signature", ["window_size", "is_causal"])
def test_torch_varlen_adapter_passes_flash_attn_arguments_to_varlen_attn(tiny, sampled, monkeypatch, signature):
    """`varlen.torch_varlen` calls torch's varlen_attn with the arguments flash-attn's function is called
    with: causal aligned to each segment's last key (window_size=(-1, 0), or is_causal in torch's other
    signature), grouped-query heads shared (enable_gqa, or k/v repeated where torch has no such flag).
    varlen_attn here is `_varlen_reference` behind each of torch's two signatures; the real kernel runs
    on CUDA only (`test_cuda_varlen_kernel_equals_buckets`)."""
    import torch.nn.attention.varlen as tv

    import verirl.train.packing as packing

    seen = []
    if signature == "window_size":
        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                 enable_gqa=False):
            seen.append((window_size, enable_gqa, k.shape[1] == q.shape[1]))
            return _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=window_size == (-1, 0))
    else:
        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False):
            seen.append((is_causal, k.shape[1] == q.shape[1]))
            return _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=is_causal)
    monkeypatch.setattr(tv, "varlen_attn", fake)
    adapter = varlen.torch_varlen(direct=False)
    assert adapter is not None

    def run(fn):
        monkeypatch.setattr(packing, "varlen_kernel", lambda query, dropout=0.0: fn)
        model = copy.deepcopy(tiny.model)
        lp, _, mask = packed_logprobs(model, sampled, list(range(16)))
        (lp * mask).sum().backward()
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    (la, ga), (lb, gb) = run(None), run(adapter)
    assert tiny.model.config.num_key_value_heads < tiny.model.config.num_attention_heads  # grouped-query heads
    assert seen and set(seen) == ({((-1, 0), True, False)} if signature == "window_size" else {(True, True)})
    assert (la - lb).abs().max() <= 1e-5
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 1e-5 * ga[n].abs().max() + 1e-6, n
    with pytest.raises(ConfigError, match="dropout"):
        adapter(*[torch.zeros(1)] * 5, 1, 1, dropout_p=0.1)


def test_which_torch_varlen_kernel(monkeypatch):
    """By default torch's flash kernels are called directly (`flash_varlen`); VERIRL_VARLEN=torch keeps
    torch's varlen_attn function; neither takes dropout."""
    monkeypatch.delenv("VERIRL_VARLEN", raising=False)
    assert varlen.torch_varlen() is varlen.flash_varlen
    monkeypatch.setenv("VERIRL_VARLEN", "torch")
    assert varlen.torch_varlen() not in (None, varlen.flash_varlen)
    with pytest.raises(ConfigError, match="dropout"):
        varlen.flash_varlen(*[torch.zeros(1)] * 5, 1, 1, dropout_p=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's flash kernels run on CUDA only")
@pytest.mark.parametrize("kv_heads", [3, 9])
def test_flash_varlen_equals_torch_varlen_attn(kv_heads):
    """On a GPU: the direct call gives torch's varlen_attn's outputs and gradients (the same kernels), for
    packed causal segments whose queries are the last of their keys (a shared prompt's keys repeated)."""
    g = torch.Generator().manual_seed(0)
    q_lens, k_lens = [5, 17, 1, 40], [9, 17, 30, 40]
    cu_q = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32).cuda()
    cu_k = torch.tensor([0] + k_lens).cumsum(0).to(torch.int32).cuda()

    def leaf(n, h):
        return torch.randn(n, h, 64, generator=g).to("cuda", torch.bfloat16).requires_grad_()

    q, k, v = leaf(sum(q_lens), 9), leaf(sum(k_lens), kv_heads), leaf(sum(k_lens), kv_heads)
    grad = torch.randn(sum(q_lens), 9, 64, generator=g).to("cuda", torch.bfloat16)
    outs = []
    for fn in (varlen.flash_varlen, varlen.torch_varlen(direct=False)):
        o = fn(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), softmax_scale=0.125, causal=True)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad)
        outs.append((o, dq, dk, dv))
    assert torch.equal(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1:], outs[1][1:]):
        assert (a.float() - b.float()).abs().max() <= 1e-2 * b.float().abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen kernels run on CUDA only")
@pytest.mark.parametrize("kernel", ["flash_varlen", "varlen_attn", "flash_attn"])
def test_cuda_varlen_kernel_equals_buckets(tiny, sampled, monkeypatch, kernel):
    """On a GPU, in bfloat16: the real varlen kernel (torch's flash kernels called directly, torch's varlen_attn,
    flash-attn's function where installed) gives the buckets' log-probs, entropies' gradients and weight
    gradients for the packed rows, a shared prompt's keys gathered once per response."""
    import verirl.train.packing as packing

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("torch's flash kernels need an Ampere or newer GPU")
    if kernel == "flash_attn":
        fn = pytest.importorskip("flash_attn").flash_attn_varlen_func
    else:
        fn = varlen.flash_varlen if kernel == "flash_varlen" else varlen.torch_varlen(direct=False)
    if fn is None:
        pytest.skip("this torch has no varlen_attn")
    model0 = copy.deepcopy(tiny.model).to("cuda", torch.bfloat16)
    roll = Rollout(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in vars(sampled).items()})

    def run(f):
        monkeypatch.setattr(packing, "varlen_kernel", lambda query, dropout=0.0: f)
        model = copy.deepcopy(model0)
        lp, ent, mask = packed_logprobs(model, roll, list(range(16)), with_entropy=True, share_prompt=True)
        ((lp.float() * mask).sum() + 0.1 * (ent.float() * mask).sum()).backward()
        return lp.detach().float(), mask.bool(), {n: p.grad.float() for n, p in model.named_parameters()}

    (la, mask, ga), (lb, _, gb) = run(None), run(fn)
    assert (la - lb)[mask].abs().max() <= 0.05  # two bfloat16 computations of the same attention
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 0.05 * ga[n].abs().max() + 1e-3, n


def test_auto_chunk_per_device():
    """The head's rows per chunk: about 4M float32 logits on a CPU, 64M on an accelerator, never
    under 64 rows (hand-computed)."""
    from verirl.core.ops.head_logprobs import auto_chunk

    assert auto_chunk(49152) == 85  # 2^22 // 49,152 (SmolLM2)
    assert auto_chunk(151936) == 64  # 2^22 // 151,936 = 27: the 64-row floor (Qwen2.5)
    assert auto_chunk(49152, "cuda") == 1365  # 2^26 // 49,152
    assert auto_chunk(151936, "npu") == 441  # 2^26 // 151,936
    assert auto_chunk(366, "cpu", budget_elems=1 << 20) == 2864


def test_pack_rows_by_hand():
    """Two samples of prompt [5, 6] (responses [7, 8] and [9]) and one of prompt [4] (an empty
    response), laid out by hand: shared prompts once, positions restarting per prompt, each label
    predicted by the position before it, and the segments of a variable-length kernel."""
    roll = _rollout([[5, 6], [5, 6], [4]], [[7, 8], [9], []])
    pb = pack_rows(roll, [0, 1, 2], share_prompt=True)
    assert pb.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 3, 2, 0]]
    assert pb.pred_pos.tolist() == [1, 2, 1] and pb.labels.tolist() == [7, 8, 9]
    assert pb.out_row.tolist() == [0, 0, 1] and pb.out_col.tolist() == [0, 1, 0] and (pb.rows, pb.width) == (3, 2)
    vl = pb.layout.varlen  # segments in packed order: prompt [5, 6], response [7, 8], response [9], prompt [4]
    assert vl.cu_q.tolist() == [0, 2, 4, 5, 6] and vl.cu_k.tolist() == [0, 2, 6, 9, 10]
    assert vl.k_pos.tolist() == [0, 1, 0, 1, 2, 3, 0, 1, 4, 5] and (vl.max_q, vl.max_k) == (2, 4)
    # buckets, longest keys first: [7, 8] (4 keys) with [9] (3 >= 0.7 x 4, padded), then [5, 6] (2 keys),
    # then [4] (1 < 0.7 x 2)...
    assert [b.k_idx.tolist() for b in pb.layout.buckets] == [[[0, 1, 2, 3], [0, 1, 4, 0]], [[0, 1]], [[5]]]
    assert [b.q_idx.tolist() for b in pb.layout.buckets] == [[[2, 3], [4, 0]], [[0, 1]], [[5]]]
    assert pb.layout.inverse.tolist() == [3, 4, 0, 1, 2, 5]  # ...whose outputs (2, 3, 4, 0, 1, 5) go back here
    flat = pack_rows(roll, [0, 1, 2], share_prompt=False)
    assert flat.input_ids.tolist() == [[5, 6, 7, 8, 5, 6, 9, 4]] and flat.pred_pos.tolist() == [1, 2, 5]
    assert flat.layout.varlen.k_pos is None and flat.layout.varlen.cu_q.tolist() == [0, 4, 7, 8]
