"""model.compute_dtype: the log-prob passes and the update multiply in bfloat16 under torch.autocast,
over float32 weights, gradients and optimizer state (mixed precision), on the real tiny model."""
import copy

import pytest
import torch

from verirl.core.errors import ConfigError
from verirl.models.device import compute_dtype, native_bf16
from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, compute_logprobs, update_policy
from verirl.train.packing import pack_rows
from verirl.train.strategy import final_hidden
from verirl.core.types import Rollout, TrainBatch

CPU = torch.device("cpu")


def test_compute_dtype_names():
    assert compute_dtype(None, torch.float32, CPU) is None
    assert compute_dtype("float32", torch.float32, CPU) is None
    assert compute_dtype("bfloat16", torch.float32, CPU) is torch.bfloat16
    assert compute_dtype("auto", torch.float32, CPU) is (torch.bfloat16 if native_bf16(CPU) else None)
    assert compute_dtype("auto", torch.bfloat16, CPU) is None  # already low precision: nothing to mix
    assert compute_dtype(None, torch.bfloat16, CPU) is None
    with pytest.raises(ConfigError, match=r"model.compute_dtype=bfloat16 computes over float32 weights.*"
                                          r"model.dtype=bfloat16.*Set model.dtype=float32"):
        compute_dtype("bfloat16", torch.bfloat16, CPU)
    with pytest.raises(ConfigError, match=r"model.compute_dtype='bf16'.*known: null, auto.*Did you mean bfloat16"):
        compute_dtype("bf16", torch.float32, CPU)


def test_bad_compute_dtype_is_refused_before_the_run_touches_its_directory(tmp_path):
    """Checked with the other names, before the trainer clears a previous run (trainer.overwrite)."""
    import subprocess
    import sys

    from verirl.run.checks import check
    from verirl.config import load_config

    with pytest.raises(ConfigError, match="model.compute_dtype='half'"):
        check(load_config("tiny", [f"trainer.run_dir={tmp_path}", "model.compute_dtype=half"]))
    run = tmp_path / "previous"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    out = subprocess.run([sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}", "model.dtype=bfloat16",
                          "model.compute_dtype=bfloat16", "trainer.overwrite=true", "trainer.resume=false"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "model.compute_dtype=bfloat16 computes over float32 weights" in out.stderr
    assert (run / "metrics.jsonl").read_text() == "{}\n" and (run / "checkpoints").is_dir()


@pytest.mark.parametrize("remove_padding", [True, False])
def test_mixed_precision_logprobs_are_close_to_float32_and_not_equal(tiny, sampled, remove_padding):
    """bfloat16 products move the log-probs (so the pass did run in bfloat16: the oneDNN float32 path
    steps aside under autocast), by about bfloat16's rounding, never more."""
    mask = sampled.response_mask.bool()
    full = compute_logprobs(tiny.model, sampled, LogprobPass(remove_padding=remove_padding))
    mixed = compute_logprobs(tiny.model, sampled, LogprobPass(remove_padding=remove_padding,
                                                              compute_dtype=torch.bfloat16))
    assert mixed.dtype == torch.float32
    diff = (mixed - full)[mask].abs()
    assert diff.max() > 1e-4
    assert diff.max() < 0.15 and diff.mean() < 0.02
    assert next(tiny.model.parameters()).dtype == torch.float32


def test_packed_output_layer_stays_in_float32(tiny, sampled):
    """Under mixed precision the packed pass's log-probs are those of its own (bfloat16-computed) final
    hidden states through a float32 output layer: equal to float32 rounding, not to bfloat16's."""
    rows = list(range(sampled.response_ids.shape[0]))
    pb = pack_rows(sampled, rows)
    from verirl.train.packing import _packed_attention
    from verirl.train.record import response_positions

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with _packed_attention(tiny.model, pb.layout), response_positions(pb.pred_pos, pb.out_col == 0):
            hidden = final_hidden(tiny.model, pb.input_ids, pb.position_ids)[0]
    assert hidden.dtype == torch.float32
    w = tiny.model.get_output_embeddings().weight
    by_hand = torch.log_softmax(hidden.index_select(0, pb.pred_pos) @ w.t(), -1).gather(1, pb.labels[:, None])[:, 0]
    mixed = compute_logprobs(tiny.model, sampled, LogprobPass(compute_dtype=torch.bfloat16))
    ours = mixed[pb.out_row, pb.out_col]
    assert (ours - by_hand).abs().max() < 1e-5


def test_mixed_precision_update_keeps_float32_weights_grads_and_state(tiny, sampled):
    """The update under autocast: float32 gradients close in direction to the float32 update's, a float32
    optimizer state, and weights that moved."""
    batch = TrainBatch(sampled, torch.linspace(-1.0, 1.0, sampled.response_ids.shape[0]))
    grads = {}
    for low in (None, torch.bfloat16):
        model = copy.deepcopy(tiny.model)
        before = {n: q.detach().clone() for n, q in model.named_parameters()}
        opt, sched = build_optimizer(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
        p = UpdateParams(group_size=4, mini_batch_prompts=4, forward=LogprobPass(compute_dtype=low), grad_clip=0.0)
        captured = {}
        hooks = [q.register_hook(lambda g, n=n: captured.__setitem__(n, g.detach().clone()))
                 for n, q in model.named_parameters()]
        stats = update_policy(model, opt, sched, batch, p)
        for h in hooks:
            h.remove()
        assert stats["actor/nonfinite_updates"] == 0
        assert all(q.dtype == torch.float32 for q in model.parameters())
        assert all(g.dtype == torch.float32 for g in captured.values())
        assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if v.is_floating_point())
        assert any(not torch.equal(q, before[n]) for n, q in model.named_parameters())
        grads[low] = torch.cat([g.flatten() for _, g in sorted(captured.items())])
    full, mixed = grads[None], grads[torch.bfloat16]
    cos = torch.nn.functional.cosine_similarity(full, mixed, dim=0)
    assert 0.98 < cos < 1.0 - 1e-7, cos  # close, and not the float32 gradient itself


@pytest.mark.parametrize("fixed", [False, True])
def test_native_engine_products_in_bfloat16(tiny, arith, monkeypatch, fixed):
    """compute_dtype=bfloat16 in the native engine: the lean decoder's four products per layer multiply in
    bfloat16 (the sampled log-probs move by about bfloat16's rounding, not more), the rest stays float32;
    also in the one-shape steps a CUDA graph captures (run eagerly here)."""
    import verirl.rollout.native as native
    from verirl.rollout import NativeEngine, SamplingParams

    if fixed:
        monkeypatch.setattr(native, "_one_shape", lambda device: (True, False))
    train, _ = arith
    prompts = [p.ids for p in train[:6]]
    params = SamplingParams(max_new_tokens=24, seed=7)
    full = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(prompts, 4, params)
    mixed = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids, compute_dtype=torch.bfloat16).generate(
        prompts, 4, params)
    assert mixed.sample_logprobs.dtype == torch.float32
    same = [torch.equal(a[m.bool()], b[n.bool()]) for a, m, b, n in
            zip(full.response_ids, full.response_mask, mixed.response_ids, mixed.response_mask)]
    assert sum(same) >= 0.75 * len(same)  # the same tokens, mostly: a near-tie can flip
    rows = [i for i, ok in enumerate(same) if ok]
    w = min(full.sample_logprobs.shape[1], mixed.sample_logprobs.shape[1])
    mask = full.response_mask[rows, :w].bool()
    diff = (full.sample_logprobs[rows, :w] - mixed.sample_logprobs[rows, :w])[mask].abs()
    assert 1e-5 < diff.max() < 0.15 and diff.mean() < 0.02


def test_the_embedded_default_says_it_computes_in_bfloat16(tmp_path):
    """The tiny recipe asks for model.compute_dtype=auto; the trainer says what it resolved to."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={tmp_path}",
                          "trainer.total_steps=1", "eval.before_train=false", "eval.at_end=false", "log.progress=plain"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    if native_bf16(CPU):
        assert "mixed precision (model.compute_dtype=auto): the log-prob passes, the update and the native " \
               "engine's products multiply in bfloat16 over float32 weights" in out.stdout
    else:
        assert "mixed precision" not in out.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_mixed_precision_packed_pass_takes_the_varlen_kernel(tiny, sampled):
    """On a GPU: under bfloat16 autocast the packed attention gets q, k and v in one dtype, so the varlen
    flash kernel runs (not the buckets); the log-probs stay close to the float32 pass on the same GPU."""
    import verirl.train.packing as packing

    model = copy.deepcopy(tiny.model).cuda()
    roll = Rollout(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in vars(sampled).items()})
    calls = []
    real = packing.varlen_kernel

    def spy(query, dropout=0.0):
        fn = real(query, dropout)
        calls.append((query.dtype, fn is not None))
        return fn

    packing.varlen_kernel = spy
    try:
        mixed = compute_logprobs(model, roll, LogprobPass(compute_dtype=torch.bfloat16))
    finally:
        packing.varlen_kernel = real
    full = compute_logprobs(model, roll, LogprobPass())
    assert calls and all(dtype == torch.bfloat16 and found for dtype, found in calls), calls
    mask = roll.response_mask.bool()
    assert (mixed - full)[mask].abs().max() < 0.15
