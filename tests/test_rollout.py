"""The native engine against transformers' generate on the real tiny model."""
import pytest
import torch

from verirl.rollout import HFEngine, NativeEngine, SamplingParams
from verirl.rollout.base import build_rollout


def test_native_greedy_equals_hf_generate(tiny, arith):
    _, val = arith
    prompts = [p.ids for p in val[:10]]  # different prompt lengths -> left padding
    assert len({len(p) for p in prompts}) > 1
    params = SamplingParams(max_new_tokens=24, temperature=0)
    a = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 1, params)
    b = HFEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 1, params)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.response_ids, b.response_ids)


def test_n_samples_per_prompt_are_contiguous_and_seeded(tiny, arith):
    train, _ = arith
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=7)
    r1 = eng.generate([p.ids for p in train[:3]], 5, params)
    r2 = eng.generate([p.ids for p in train[:3]], 5, params)
    assert r1.response_ids.shape[0] == 15
    assert torch.equal(r1.response_ids, r2.response_ids)  # same seed, same samples
    for g in range(3):  # rows of one group share the prompt
        assert (r1.prompt_ids[5 * g:5 * g + 5] == r1.prompt_ids[5 * g]).all()


def test_finished_rows_leave_the_batch(tiny, arith):
    train, _ = arith
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    r = eng.generate([p.ids for p in train[:4]], 4, SamplingParams(max_new_tokens=40, temperature=1.0, seed=1))
    sizes = eng.batch_sizes
    assert sizes[0] == 4  # each distinct prompt is prefilled once
    assert sizes[1] == 16
    assert sizes[1:] == sorted(sizes[1:], reverse=True)  # never grows
    assert sizes[-1] < 16 and bool(r.stopped.any())


def test_lean_decoder_logits_equal_the_model(tiny, arith):
    """The lean forward (fused projections, in-place cache) computes the model's own logits."""
    from verirl.rollout.base import left_pad
    from verirl.rollout.lean import LeanDecoder, lean_supported
    from verirl.rollout.native import _LeanStepper

    train, _ = arith
    assert lean_supported(tiny.model)
    ids, mask = left_pad([p.ids for p in train[:5]], tiny.pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = tiny.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        ours = _LeanStepper(tiny.model).prefill(ids, mask, pos, ids.shape[1] + 4)
    assert (ours - theirs).abs().max() < 1e-4
    assert isinstance(_LeanStepper(tiny.model).dec, LeanDecoder)


def test_max_new_tokens_and_top_k(tiny, arith):
    train, _ = arith
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    r = eng.generate([p.ids for p in train[:2]], 3, SamplingParams(max_new_tokens=5, seed=0))
    assert r.response_ids.shape[1] <= 5
    assert (r.response_mask.sum(-1) <= 5).all()
    # top_k=1 is greedy
    g = eng.generate([p.ids for p in train[:2]], 1, SamplingParams(max_new_tokens=24, temperature=0))
    k1 = eng.generate([p.ids for p in train[:2]], 1, SamplingParams(max_new_tokens=24, temperature=1.0, top_k=1, seed=5))
    assert torch.equal(g.response_ids, k1.response_ids)


def test_response_mask_by_position_not_by_pad_id():
    # pad id 0 is also a stop id; a response whose FIRST token is 0 is one token long, and a
    # response that never stops keeps every position (including generated 0s after... none here)
    tokens = torch.tensor([[0, 5, 6], [5, 6, 7], [5, 0, 0]])
    r = build_rollout(torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long), tokens,
                      stop_ids=[0], pad_id=0)
    assert r.response_mask.tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 0]]
    assert r.stopped.tolist() == [True, False, True]


def test_chunked_generation_equals_one_call(tiny, arith):
    from verirl.rollout import generate_chunked
    _, val = arith
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    prompts = [p.ids for p in val[:5]]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    whole = generate_chunked(eng, prompts, 2, params, 0, tiny.pad_id)
    parts = generate_chunked(eng, prompts, 2, params, 4, tiny.pad_id)  # 2 prompts per call
    for a, b in [(whole.response_mask, parts.response_mask), (whole.response_ids, parts.response_ids),
                 (whole.prompt_ids, parts.prompt_ids), (whole.prompt_mask, parts.prompt_mask)]:
        assert torch.equal(a, b)


def test_eos_disagreement_warns(tiny, tmp_path):
    """The Qwen2.5 base-vs-instruct trap: config.json's EOS is not one generate() stops on."""
    import json
    import shutil

    import pytest

    from verirl.models import load_model
    shutil.copytree(tiny.path, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "pad_token_id": 0}))
    with pytest.warns(UserWarning, match="EOS ids disagree"):
        lm = load_model(str(tmp_path / "m"))
    assert lm.stop_ids == [0, 2]  # we stop on all of them


def test_sampling_frequencies_follow_the_probabilities():
    """Inverse-CDF sampling draws token i with probability softmax(logits / T)_i; top-k / top-p cut the tail."""
    from verirl.rollout.sampling import sample_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(40000, 1)
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(sample_next(logits, 1.0, generator=gen), minlength=4).float() / 40000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.01), freq
    # temperature 2 flattens: p ~ sqrt(p)
    want = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    freq = torch.bincount(sample_next(logits, 2.0, generator=gen), minlength=4).float() / 40000
    assert torch.allclose(freq, want / want.sum(), atol=0.01), freq
    # top_p 0.75 keeps {0.5, 0.3} renormalised; top_k 1 is greedy
    freq = torch.bincount(sample_next(logits, 1.0, top_p=0.75, generator=gen), minlength=4).float() / 40000
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01), freq
    assert (sample_next(logits, 1.0, top_k=1, generator=gen) == 0).all()


def test_lean_decoder_on_llama_matches_transformers_generate():
    """SmolLM2's architecture (Llama, GQA 6:2): lean greedy decoding = transformers' generate."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from verirl.rollout.lean import lean_supported

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=3, bos_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    assert lean_supported(model)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, 97, (n,), generator=g).tolist() for n in (3, 9, 14)]
    params = SamplingParams(max_new_tokens=12, temperature=0)
    a = NativeEngine(model, 0, [3]).generate(prompts, 2, params)
    b = HFEngine(model, 0, [3]).generate(prompts, 2, params)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)


def test_hf_stepper_equals_the_lean_decoder(tiny, arith, monkeypatch):
    """Models the lean decoder does not cover decode through their own forward (_HFStepper, which
    keeps its own attention mask through repeats, compaction and steps): same greedy tokens."""
    import verirl.rollout.native as native

    _, val = arith
    prompts = [p.ids for p in val[:6]]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    # compact at the first finished row (0.99: in batches of up to 100 rows): the tiny model's answers are
    # 17-20 tokens long, and whether a quarter of them (the default) ends early enough depends on a machine's
    # last bits
    monkeypatch.setattr(native, "COMPACT_AT", 0.99)
    lean = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 2, params)
    monkeypatch.setattr(native, "lean_supported", lambda model: False)
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    hf = eng.generate(prompts, 2, params)
    assert eng.batch_sizes[-1] < eng.batch_sizes[1]  # rows were compacted on the way
    assert torch.equal(lean.response_ids, hf.response_ids) and torch.equal(lean.response_mask, hf.response_mask)
    assert torch.equal(lean.prompt_ids, hf.prompt_ids)


@pytest.mark.parametrize("attention", ["small", "sdpa"])
def test_fixed_shape_steps_equal_the_dynamic_ones(tiny, arith, monkeypatch, attention):
    """The decoding step that a CUDA graph captures on a GPU (one shape for every step: the whole cache
    attended with the columns not yet written masked, keys written at a column held in a tensor, no
    compaction), run eagerly here: the same greedy tokens and the same seeded samples as the steps
    that grow with the cache and drop finished rows."""
    import verirl.rollout.lean as lean
    import verirl.rollout.native as native

    if attention == "sdpa":  # the long-cache branch (SDPA with the bias as its mask), for both kinds of step
        monkeypatch.setattr(lean, "small_enough", lambda q, k: False)
    _, val = arith
    prompts = [p.ids for p in val[:6]]
    greedy = SamplingParams(max_new_tokens=24, temperature=0)
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    monkeypatch.setattr(native, "COMPACT_AT", 0.99)  # compact at the first finished row (as above)
    eng = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    dyn_g = eng.generate(prompts, 2, greedy)
    dyn_s = eng.generate(prompts, 3, sampled)
    assert eng.batch_sizes[-1] < eng.batch_sizes[1]  # rows were compacted on the way
    monkeypatch.setattr(native, "_one_shape", lambda device: (True, False))
    fix_g = eng.generate(prompts, 2, greedy)
    fix_s = eng.generate(prompts, 3, sampled)
    assert set(eng.batch_sizes[1:]) == {18}  # every step ran on all rows
    for a, b in [(dyn_g, fix_g), (dyn_s, fix_s)]:
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert (dyn_s.sample_logprobs - fix_s.sample_logprobs).abs().max() < 1e-5
    assert bool(fix_s.stopped.any())  # finished rows stepped on, and their tokens were dropped


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_steps_equal_the_eager_fixed_steps(tiny, arith, monkeypatch):
    """On a GPU: the captured decoding step replays the eager one-shape step exactly, for n > 1 and
    for two calls of different shapes in a row (each call captures its own graph)."""
    import copy

    import verirl.rollout.native as native

    train, val = arith
    model = copy.deepcopy(tiny.model).cuda()
    eng = NativeEngine(model, tiny.pad_id, tiny.stop_ids)
    calls = [([p.ids for p in val[:6]], 3, SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)),
             ([p.ids for p in train[:4]], 2, SamplingParams(max_new_tokens=16, temperature=0))]
    monkeypatch.setattr(native, "_one_shape", lambda device: (True, True))
    graphed = [eng.generate(*c) for c in calls]
    monkeypatch.setattr(native, "_one_shape", lambda device: (True, False))
    eager = [eng.generate(*c) for c in calls]
    for a, b in zip(graphed, eager):
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)


def test_every_engine_has_the_whole_protocol(tiny):
    """Every registered engine has each member of `Engine` (so the step and the loop call them without
    getattr), with ``reads_live_model`` a bool on the class; the engines over the live model say so,
    and close() may be called twice."""
    from verirl.rollout import ENGINES, Engine
    from verirl.rollout.vllm import VLLMEngine

    members = {k for k in vars(Engine) if not k.startswith("_")} | set(Engine.__annotations__)
    assert {"generate", "sync_weights", "close", "reads_live_model"} <= members
    classes = {name: VLLMEngine if name == "vllm" else ENGINES[name] for name in ENGINES}
    for name, cls in classes.items():
        missing = sorted(m for m in members if not hasattr(cls, m))
        assert not missing, f"{name} lacks {missing}"
        assert isinstance(cls.reads_live_model, bool), name
    assert {n for n, c in classes.items() if c.reads_live_model} == {"native", "hf"}
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    engine.close()
    engine.close()


def test_a_row_that_ended_early_without_a_stop_has_only_its_own_tokens():
    """An engine that ends a row at its context length returns fewer tokens than the call's width, without a
    stop: the row is those tokens, not padded up to the width (and a pad that equals a stop id is no stop)."""
    from verirl.rollout.base import build_rollout

    tokens = torch.tensor([[5, 6, 7, 2, 2], [5, 2, 9, 9, 9], [8, 8, 2, 2, 2]])
    empty = torch.zeros((3, 0), dtype=torch.long)
    r = build_rollout(empty, empty, tokens, [2], pad_id=2, lengths=[3, 5, 2])
    assert r.response_lengths.tolist() == [3, 2, 2] and r.stopped.tolist() == [False, True, False]
    assert r.response_ids[0, :3].tolist() == [5, 6, 7] and r.loss_mask.sum(-1).tolist() == [3, 2, 2]
