"""The native engine against transformers' generate on the real tiny model."""
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
    sizes = []
    hook = tiny.model.register_forward_pre_hook(lambda m, args, kw: sizes.append(kw["input_ids"].shape[0]),
                                                with_kwargs=True)
    try:
        r = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(
            [p.ids for p in train[:4]], 4, SamplingParams(max_new_tokens=40, temperature=1.0, seed=1))
    finally:
        hook.remove()
    assert sizes[0] == 4  # each distinct prompt is prefilled once
    assert sizes[1] == 16
    assert sizes == sorted(sizes[:1]) + sorted(sizes[1:], reverse=True)  # never grows
    assert sizes[-1] < 16 and bool(r.stopped.any())


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
