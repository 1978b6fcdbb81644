"""Keyed sampling: the uniform behind each token is a function of (seed, global prompt position,
sample index, token position), so a prompt's rollout does not depend on the batch it is in.

The rollout comparisons use the embedded tiny model, where they must be identical. Should one
ever differ, the failure says whether the first differing token's uniform lies within 1e-6 of
a CDF boundary (a logit that differs in its last bits between batch shapes flips such a token)."""
import random
from types import SimpleNamespace

import pytest
import torch

from verirl.rollout import HFEngine, NativeEngine, SamplingParams, generate_chunked
from verirl.rollout.sampling import inverse_cdf, keyed_uniforms, philox4x32, sample_next, sampling_weights

MASK = 0xFFFFFFFF


def philox_reference(ctr, key, rounds=10):
    """Philox4x32 written from the paper with Python's unbounded ints: the independent reference."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c3 ^ k1) & MASK, p0 & MASK
        k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
    return c0, c1, c2, c3


def test_philox_matches_the_published_vectors_and_a_reference():
    # Random123's kat_vectors for philox4x32-10
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        assert philox_reference(ctr, key) == want
        got = philox4x32(tuple(torch.tensor(c) for c in ctr), key)
        assert tuple(int(x) for x in got) == want
    rng = random.Random(0)
    ctrs = [[rng.getrandbits(32) for _ in range(4)] for _ in range(200)] + [[MASK, 0, MASK, 1], [1, MASK, 0, MASK]]
    key = (rng.getrandbits(32), rng.getrandbits(32))
    got = philox4x32(tuple(torch.tensor([c[i] for c in ctrs]) for i in range(4)), key)
    for r, c in enumerate(ctrs):
        assert tuple(int(x[r]) for x in got) == philox_reference(c, key)


def test_keyed_uniforms_are_uniform_distinct_and_53_bit():
    g = torch.arange(100)[:, None, None]
    j = torch.arange(10)[None, :, None]
    t = torch.arange(100)[None, None, :]
    u = keyed_uniforms(1234, g, j, t)  # 100k draws
    assert u.shape == (100, 10, 100) and u.dtype == torch.float64
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert u.unique().numel() == u.numel()
    assert abs(float(u.mean()) - 0.5) < 0.005  # 5 sigma: sqrt(1/12 / 1e5) = 0.0009
    assert abs(float(u.var()) - 1 / 12) < 0.0015  # 5 sigma: sqrt((1/80 - 1/144) / 1e5) = 0.00024
    bits = (u * 2.0 ** 53).long()  # integers below 2^53, every bit random: the lowest is odd half the time
    assert torch.equal(bits.double(), u * 2.0 ** 53)
    assert abs(float((bits & 1).double().mean()) - 0.5) < 0.01
    for a, b in [(u[:, :, 1:], u[:, :, :-1]), (u[:, 1:], u[:, :-1]), (u[1:], u[:-1])]:  # neighbouring keys
        r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
        assert abs(float(r)) < 0.02, r
    # a pure function of the keys: any slice, any order, any device layout gives the same numbers
    assert torch.equal(keyed_uniforms(1234, torch.tensor([7, 3]), torch.tensor([2, 9]), torch.tensor([5, 0])),
                       torch.stack([u[7, 2, 5], u[3, 9, 0]]))
    other = keyed_uniforms(1235, g, j, t)
    assert float((other == u).double().mean()) == 0
    assert torch.equal(keyed_uniforms(-1, g[:2], j, t), keyed_uniforms(2 ** 64 - 1, g[:2], j, t))  # modulo 2^64


def test_inverse_cdf_resolves_below_float32():
    """Weights [1, 1e-10]: token 1 owns [1/(1 + 1e-10), 1) of the uniforms, an interval a float32
    running sum (1 + 1e-10 == 1 in float32) gives to nobody."""
    w = torch.tensor([[1.0, 1e-10, 0.0]]).repeat(4, 1)
    edge = 1 / (1 + 1e-10)
    u = torch.tensor([0.0, edge - 1e-12, edge + 1e-12, 1 - 2.0 ** -53], dtype=torch.float64)
    assert inverse_cdf(w, u).tolist() == [0, 0, 1, 1]  # and never the weight-0 token 2


@pytest.mark.parametrize("V", [3001, 366])
def test_inverse_cdf_equals_a_float64_running_sum(V):
    """3001: three whole blocks and a partial one, a block of weight 0; 366: at most one block (the
    embedded model's vocabulary), the single-level path."""
    torch.manual_seed(0)
    N = 20000
    logits = torch.randn(1, V) * 4
    logits[0, ::7] = float("-inf")
    if V > 2048:
        logits[0, 1024:2048] = float("-inf")  # a whole block of weight 0
    logits[0, -3:] = float("-inf")  # the last tokens too
    w = torch.exp(logits - logits.max())
    u = torch.cat([torch.rand(N - 2, dtype=torch.float64), torch.tensor([0.0, 1 - 2.0 ** -53], dtype=torch.float64)])
    cdf = w.double().cumsum(-1)
    want = torch.searchsorted(cdf.expand(N, V).contiguous(), u[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    got = inverse_cdf(w.expand(N, V).contiguous(), u)
    assert torch.equal(got, want)
    assert bool((w[0, got] > 0).all())


def boundary_report(model, params: SamplingParams, prompts, index, n: int, a, b) -> str:
    """For the first token where rollouts a and b differ: its keys, its uniform, and its distance to
    the nearest boundary of the CDF the model gives at that point (a's prefix, alone in its batch)."""
    diff = (a.response_ids != b.response_ids) | (a.response_mask != b.response_mask)
    if not bool(diff.any()):
        return "identical"
    row, t = (int(x) for x in diff.nonzero()[0])
    g, j = index[row // n], row % n
    u = float(keyed_uniforms(params.seed, torch.tensor(g), torch.tensor(j), torch.tensor(t)))
    prefix = list(prompts[row // n]) + a.response_ids[row, :t].tolist()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix])).logits[:, -1]
    w = sampling_weights(logits, params.temperature, params.top_k, params.top_p).double()
    cdf = w.cumsum(-1)[0] / w.sum()
    gap = float((cdf - u).abs().min())
    picks = int(inverse_cdf(w.float(), torch.tensor([u], dtype=torch.float64)))
    return (f"row {row} (prompt {g}, sample {j}) differs first at token {t}: "
            f"{a.response_ids[row, t].item()} vs {b.response_ids[row, t].item()} (alone in its batch: {picks}); "
            f"its uniform {u:.12f} is "
            f"{gap:.3g} from the nearest CDF boundary: {'WITHIN' if gap < 1e-6 else 'NOT within'} 1e-6, "
            f"{'a last-bits logit flip' if gap < 1e-6 else 'a real dependence on the batch layout'}")


def take(r, rows, width: int, pad_id: int) -> SimpleNamespace:
    """Rows of a rollout, responses right-padded to ``width``: rollouts of different calls compare."""
    rows = torch.as_tensor(list(rows))
    ids, mask = r.response_ids[rows], r.response_mask[rows]
    extra = width - ids.shape[1]
    return SimpleNamespace(response_ids=torch.cat([ids, ids.new_full((len(rows), extra), pad_id)], 1),
                           response_mask=torch.cat([mask, mask.new_zeros((len(rows), extra))], 1),
                           stopped=r.stopped[rows])


def assert_same(tiny, params, prompts, index, n, a, b, rows_a=None, rows_b=None):
    """Rollout a's rows ``rows_a`` (default all) hold the same samples as b's ``rows_b``; ``prompts`` and
    ``index`` are a's prompts and their global positions."""
    a = take(a, range(a.response_ids.shape[0]) if rows_a is None else rows_a, params.max_new_tokens, tiny.pad_id)
    b = take(b, range(b.response_ids.shape[0]) if rows_b is None else rows_b, params.max_new_tokens, tiny.pad_id)
    report = boundary_report(tiny.model, params, prompts, list(index), n, a, b)
    assert report == "identical", report
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.stopped, b.stopped)


@pytest.mark.parametrize("top", [dict(), dict(top_k=40, top_p=0.9, temperature=0.8)])
def test_rollouts_do_not_depend_on_the_micro_batch(tiny, arith, top, monkeypatch):
    import verirl.rollout.native as native

    monkeypatch.setattr(native, "COMPACT_AT", 0.99)  # compact at the first finished row, on any machine
    train, _ = arith
    prompts = [p.ids for p in train[:8]]
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    params = SamplingParams(**{**dict(max_new_tokens=32, temperature=1.0, seed=2026), **top})
    whole = generate_chunked(eng, prompts, 8, params, 0, tiny.pad_id)
    assert eng.batch_sizes[1] == 64 and eng.batch_sizes[-1] < 64  # finished rows were compacted away
    assert len({tuple(x) for x in whole.response_ids[:8].tolist()}) > 1  # a group's samples differ
    for mbs in (16, 8):
        part = generate_chunked(eng, prompts, 8, params, mbs, tiny.pad_id)
        assert_same(tiny, params, prompts, range(8), 8, whole, part)


def test_a_prompt_samples_the_same_in_any_batch(tiny, arith):
    """Prompts [a, b, c, d] in one call, [c, d] alone at global positions [2, 3], [d, c] reversed, and
    two 'ranks' of two prompts each: c and d get the same tokens. This is what makes 1 and 2 ranks agree."""
    train, _ = arith
    prompts = [p.ids for p in train[10:14]]
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=11)
    n = 4

    def rows(groups, size=n, first=n):  # the first ``first`` samples of each group, in a call of groups of ``size``
        return [g * size + j for g in groups for j in range(first)]

    whole = eng.generate(prompts, n, params)
    cd = eng.generate(prompts[2:], n, params, prompt_index=[2, 3])
    assert_same(tiny, params, prompts[2:], [2, 3], n, cd, whole, rows_b=rows([2, 3]))
    dc = eng.generate(prompts[:1:-1], n, params, prompt_index=[3, 2])
    assert_same(tiny, params, prompts[:1:-1], [3, 2], n, dc, whole, rows_b=rows([3, 2]))
    for r in range(2):  # two "ranks" with two prompts each
        part = generate_chunked(eng, prompts[2 * r:2 * r + 2], n, params, 0, tiny.pad_id,
                                prompt_index=[2 * r, 2 * r + 1])
        assert_same(tiny, params, prompts[2 * r:2 * r + 2], [2 * r, 2 * r + 1], n, part, whole,
                    rows_b=rows([2 * r, 2 * r + 1]))
    # a larger group keeps the smaller group's samples as its first ones
    wider = eng.generate(prompts, n + 2, params)
    assert_same(tiny, params, prompts, range(4), n, whole, wider, rows_b=rows(range(4), n + 2, n))


def test_the_seed_matters_and_no_seed_is_unchanged(tiny, arith):
    train, _ = arith
    prompts = [p.ids for p in train[:4]]
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    a = eng.generate(prompts, 4, SamplingParams(max_new_tokens=24, seed=1))
    b = eng.generate(prompts, 4, SamplingParams(max_new_tokens=24, seed=2))
    assert not torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_ids, eng.generate(prompts, 4, SamplingParams(max_new_tokens=24, seed=1)).response_ids)
    # unseeded: torch's global generator, as before
    torch.manual_seed(5)
    c = eng.generate(prompts, 4, SamplingParams(max_new_tokens=24))
    torch.manual_seed(5)
    assert torch.equal(c.response_ids, eng.generate(prompts, 4, SamplingParams(max_new_tokens=24)).response_ids)


def test_prompt_index_is_checked_and_hf_accepts_it(tiny, arith):
    train, _ = arith
    prompts = [p.ids for p in train[:2]]
    params = SamplingParams(max_new_tokens=8, seed=3)
    with pytest.raises(ValueError, match="prompt_index has 1 entries for 2 prompts"):
        NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 2, params, prompt_index=[0])
    with pytest.raises(ValueError, match=r"outside \[0, 2\^32\)"):
        NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 2, params, prompt_index=[0, -1])
    hf = HFEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    r = generate_chunked(hf, prompts, 2, params, 2, tiny.pad_id, prompt_index=[5, 6])
    assert r.response_ids.shape[0] == 4


def test_sample_next_with_uniforms_follows_the_probabilities():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(40000, 1)
    u = keyed_uniforms(9, torch.arange(40000), torch.tensor(0), torch.tensor(0))
    freq = torch.bincount(sample_next(logits, 1.0, uniforms=u), minlength=4).double() / 40000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), atol=0.01), freq


def test_the_order_of_samples_is_checked_where_rows_leave_the_engine():
    """Row i is a sample of prompt i // n: a rollout whose rows were interleaved (sample-major
    instead of prompt-major, seed 002's bug) is refused, naming the first row that breaks it."""
    from verirl.models import load_model
    from verirl.rollout import NativeEngine, SamplingParams, check_grouped
    from verirl.core.types import Rollout

    lm = load_model("tiny", "float32", "cpu")
    engine = NativeEngine(lm.model, lm.pad_id, lm.stop_ids)
    prompts = [lm.tokenizer("1 + 1 =")["input_ids"], lm.tokenizer("22 + 3 =")["input_ids"]]
    r = engine.generate(prompts, 3, SamplingParams(4, 1.0, seed=1))
    check_grouped(r, prompts, 3, "NativeEngine")  # what the engine returns keeps the order
    order = torch.tensor([0, 3, 1, 4, 2, 5])  # the same rows, interleaved
    swapped = Rollout(**{f: getattr(r, f)[order] if torch.is_tensor(getattr(r, f)) else getattr(r, f)
                         for f in r.__dataclass_fields__})
    with pytest.raises(RuntimeError, match="row 1 should hold a sample of prompt 0"):
        check_grouped(swapped, prompts, 3, "interleaved")
    with pytest.raises(RuntimeError, match="6 rows for 2 prompts x n=2"):
        check_grouped(r, prompts, 2, "short")
