"""The activation dump (`verirl.train.record`) and `verirl compare-activations`, on the real tiny model:
statistics that do not depend on the layout (packed / padded, shared prompt, micro-batches, ranks),
gradients too, and seed 000's failure (rms_norm_eps 1e-6 vs 1e-5) named at the first RMSNorm."""
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from verirl.tools.align.activations import compare, compare_rows, relative
from verirl.train.record import ActivationRecorder, dump_path
from verirl.cli import main
from verirl.core.errors import ConfigError
from verirl.models import load_model
from verirl.rollout import NativeEngine, SamplingParams
from verirl.train import record as taps
from verirl.train.update import LogprobPass, sequence_logprobs

PADDED = LogprobPass(remove_padding=False)
PACKED = LogprobPass(remove_padding=True, share_prompt=False)
SHARED = LogprobPass(remove_padding=True, share_prompt=True)
ALL = [list(range(16))]


def record(model, rollout, how, splits=ALL, backward=False, modules=".*"):
    """The dump of log-prob forwards over ``splits`` (lists of rows; one forward each), with a backward
    of the summed log-probs per forward when ``backward``."""
    with ActivationRecorder(model, modules, backward=backward) as rec:
        for rows in splits:
            lp, _, mask = sequence_logprobs(model, rollout, rows, how)
            if backward:
                (lp * mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return rec


def assert_same(a: dict, b: dict, direction: str, tol: float):
    """Every module of ``a`` in ``b`` (and back), each statistic and sample value within ``tol`` (relative,
    floored by the module's root mean square, as compare-activations measures)."""
    ra, rb = {r["module"]: r for r in a[direction]}, {r["module"]: r for r in b[direction]}
    assert list(ra) == list(rb)  # the same modules, in the same execution order
    for name in ra:
        rel, stat, va, vb = compare_rows(ra[name], rb[name])
        assert rel <= tol, f"{direction} {name}: {stat} {va} vs {vb} (rel {rel:.2e})"


@pytest.fixture(scope="module")
def reference(tiny, sampled):
    """Padded rows, one forward, forward and backward: the layout the others are compared with."""
    return record(tiny.model, sampled, PADDED, backward=True)


@pytest.mark.parametrize("how, splits", [
    (SHARED, ALL),
    (PACKED, [list(range(7)), list(range(7, 16))]),
    (SHARED, [[0, 1, 2, 3, 4, 5], list(range(6, 16))]),  # a prompt group cut by the micro-batches
    (PADDED, [[3, 9, 12], [0, 1, 2, 4, 5, 6, 7, 8, 10, 11, 13, 14, 15]]),
], ids=["packed-shared", "packed-2mb", "shared-cut-group", "padded-2mb"])
def test_forward_statistics_do_not_depend_on_the_layout(tiny, sampled, reference, how, splits):
    rec = record(tiny.model, sampled, how, splits)
    assert rec.forwards == len(splits)
    assert_same(reference.records(), rec.records(), "forward", 1e-5)


def test_what_a_dump_holds(tiny, sampled, reference):
    reference = reference.records()
    fwd = {r["module"]: r for r in reference["forward"]}
    n_tokens = int(sampled.response_lengths.sum())
    assert {r["tokens"] for r in fwd.values()} == {n_tokens}  # the positions that predict response tokens
    # execution order: an output when it is produced (a layer after its sub-modules)
    names = list(fwd)
    assert names[0] == "model.embed_tokens"
    assert names.index("model.layers.0.input_layernorm") < names.index("model.layers.0.self_attn.q_proj") \
        < names.index("model.layers.0") < names.index("model.layers.1.input_layernorm")
    assert names[-2:] == ["model.norm", "model"]
    norm = fwd["model.layers.0.input_layernorm"]
    assert norm["dtype"] == "float32" and norm["shape"] == [128] and norm["min"] <= norm["mean"] <= norm["max"]
    assert len(norm["sample"]) == 4 and all(len(r) == 8 for r in norm["sample"])
    assert norm["sample_norms"] == sorted(norm["sample_norms"], reverse=True)
    # the output layer's logits are not per token (only kept positions, or one in the packed pass)
    assert {s["module"] for s in reference["skipped"]} == {"", "lm_head"}
    # gradients arrive in reverse: the final norm's first, the embedding's last
    bwd = [r["module"] for r in reference["backward"]]
    assert bwd[0] == "model.norm" and bwd[-1] == "model.embed_tokens"
    assert "model.rotary_emb" in fwd and "model.rotary_emb" not in bwd  # cos/sin carry no gradient


def test_statistics_by_hand(tiny, sampled):
    """One module's statistics against torch on the tapped positions of the padded forward."""
    captured = {}
    h = tiny.model.model.layers[1].post_attention_layernorm.register_forward_hook(
        lambda m, a, out: captured.__setitem__("x", out.detach().flatten(0, 1)[taps.RESPONSE_POSITIONS.get()]))
    try:
        rec = record(tiny.model, sampled, PADDED, modules=r"layers\.1\.post_attention_layernorm$")
    finally:
        h.remove()
    (row,) = rec.records()["forward"]
    x = captured["x"].double()
    assert row["tokens"] == x.shape[0] and row["shape"] == [x.shape[1]]
    rms = float(x.square().mean().sqrt())
    for key, want in (("l2", x.norm()), ("mean", x.mean()), ("std", x.std(correction=0)), ("min", x.min()),
                      ("max", x.max())):
        assert row[key] == pytest.approx(float(want), rel=1e-6, abs=1e-6 * rms), key
    top = x.norm(dim=1).topk(4).indices
    assert torch.equal(torch.tensor(row["sample"], dtype=torch.float64), x[top, :8])
    assert row["sample_norms"] == pytest.approx(x[top].norm(dim=1).tolist(), rel=1e-6)


def test_backward_statistics_do_not_depend_on_the_layout(tiny, sampled, reference):
    """Packed, two micro-batches, against padded in one: float32 gradients summed in another order."""
    rec = record(tiny.model, sampled, PACKED, [list(range(9)), list(range(9, 16))], backward=True)
    assert_same(reference.records(), rec.records(), "backward", 1e-4)


def test_backward_with_a_shared_prompt(tiny, sampled, reference):
    assert_same(reference.records(), record(tiny.model, sampled, SHARED, backward=True).records(), "backward", 1e-4)


def test_outside_a_log_prob_pass_nothing_is_recorded(tiny, sampled):
    """Generation and plain forwards set no tap: nothing recorded; the hooks are gone after the block."""
    model = tiny.model
    with torch.no_grad(), ActivationRecorder(model, ".*", backward=True) as rec:
        model(input_ids=sampled.prompt_ids[:2], attention_mask=sampled.prompt_mask[:2])
        NativeEngine(model, tiny.pad_id, tiny.stop_ids).generate([[5, 6, 7]], 2, SamplingParams(max_new_tokens=4,
                                                                                               seed=1))
    r = rec.records()
    assert rec.forwards == 0 and r["forward"] == [] and r["backward"] == []
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ConfigError, match="not a regular expression"):
        ActivationRecorder(model, "layers.(")
    with pytest.raises(ConfigError, match=r"matches no module .* model.embed_tokens"):
        ActivationRecorder(model, "decoder\\.layers")


def test_ranks_merge_into_the_one_rank_dump(tiny, sampled, reference, tmp_path):
    """Two 'ranks' (half the rows each) saved in one step directory compare equal to one rank with all."""
    one = tmp_path / "one"
    two = tmp_path / "two"
    reference.save(dump_path(one, 3, 0), {"step": 3})
    record(tiny.model, sampled, PACKED, [list(range(8))], backward=True).save(dump_path(two, 3, 0), {"step": 3})
    record(tiny.model, sampled, PACKED, [list(range(8, 16))], backward=True).save(dump_path(two, 3, 1), {"step": 3})
    assert sorted(p.name for p in (two / "step_000003").iterdir()) == ["rank0.json", "rank1.json"]
    res = compare(one, two, rtol=1e-4)
    (step,) = res["steps"]
    assert step["step"] == 3 and step["b"]["ranks"] == 2 and step["forward"]["compared"] > 50
    assert not res["diverged"], (step["forward"]["first"], step["backward"]["first"])
    assert step["forward"]["only_a"] == step["forward"]["only_b"] == []


@pytest.fixture(scope="module")
def eps_dumps(tiny, sampled, reference, tmp_path_factory):
    """Seed 000's failure: two runs that differ only in model.override_config.rms_norm_eps (1e-6, the
    tiny model's own, vs 1e-5), plus a packed run of the first; each dumped at step 1, and step 2 a
    copy of step 1 (a dump directory of several steps)."""
    root = tmp_path_factory.mktemp("activations")
    other = load_model("tiny", "float32", "cpu", override_config={"rms_norm_eps": 1e-5})
    assert tiny.model.config.rms_norm_eps == 1e-6
    assert other.model.model.layers[0].input_layernorm.variance_epsilon == 1e-5
    reference.save(dump_path(root / "a", 1), {"step": 1, "run": "a"})
    record(other.model, sampled, PADDED, backward=True).save(dump_path(root / "b", 1), {"step": 1, "run": "b"})
    record(tiny.model, sampled, PACKED, [[0, 1, 2, 3, 4, 5, 6], list(range(7, 16))], backward=True).save(
        dump_path(root / "packed", 1), {"step": 1, "run": "packed"})
    for name in ("a", "b", "packed"):
        shutil.copytree(root / name / "step_000001", root / name / "step_000002")
    return root


def test_rms_norm_eps_is_named_at_the_first_rmsnorm(eps_dumps):
    res = compare(eps_dumps / "a", eps_dumps / "b")  # the default rtol, 1e-3
    assert res["diverged"] and [s["step"] for s in res["steps"]] == [1, 2]
    fwd = res["steps"][0]["forward"]
    assert fwd["first"]["module"] == "model.layers.0.input_layernorm"
    assert fwd["first"]["order"] == 2  # the embedding and the rotary tables before it agree
    assert fwd["first"]["rel"] > 3e-3  # well beyond the tolerance, not a near miss
    assert res["steps"][0]["backward"]["diverged"]


def test_cli(eps_dumps, capsys, tmp_path):
    a, b, packed = (str(eps_dumps / n) for n in ("a", "b", "packed"))
    assert main(["compare-activations", a, b]) == 1
    out = capsys.readouterr().out
    assert "first divergence: #2 model.layers.0.input_layernorm" in out and "DIVERGED" in out
    # a packed run (two micro-batches) against a padded one, one step directory each: they agree
    assert main(["compare-activations", f"{a}/step_000001", f"{packed}/step_000002"]) == 0
    assert "AGREE" in capsys.readouterr().out
    # one file each, as JSON
    assert main(["compare-activations", f"{a}/step_000001/rank0.json", f"{b}/step_000001/rank0.json", "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["rtol"] == 1e-3 and res["diverged"] and res["steps"][0]["step"] == 1
    assert res["steps"][0]["forward"]["first"]["module"] == "model.layers.0.input_layernorm"
    assert main(["compare-activations", f"{a}/step_000002/rank0.json", f"{packed}/step_000001/rank0.json", "--json",
                 "--rtol", "1e-4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rtol"] == 1e-4 and not res["diverged"] and res["steps"][0]["forward"]["first"] is None

    # dump directories: the steps both hold are compared, the others named
    shutil.copytree(eps_dumps / "a", tmp_path / "a3")
    shutil.copytree(tmp_path / "a3" / "step_000001", tmp_path / "a3" / "step_000003")
    res = compare(tmp_path / "a3", eps_dumps / "packed")
    assert [s["step"] for s in res["steps"]] == [1, 2] and res["steps_only_a"] == [3] and not res["diverged"]
    shutil.copytree(tmp_path / "a3" / "step_000003", tmp_path / "later" / "step_000009")

    # errors the user can fix: exit 2, one paragraph naming the path
    def user_error(*argv) -> str:
        assert main(["compare-activations", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("verirl compare-activations: error:")
        return err
    assert "no such file or directory" in user_error(str(tmp_path / "missing"), b)
    (tmp_path / "x.json").write_text('{"not": "a dump"}')
    assert "not an activation dump" in user_error(str(tmp_path / "x.json"), f"{b}/step_000001/rank0.json")
    assert "not the same kind of path" in user_error(f"{a}/step_000001", b)
    assert "must be a positive number" in user_error(a, b, "--rtol", "0")
    assert "none in common" in user_error(a, str(tmp_path / "later"))


def test_relative_tolerance():
    assert relative(1.0, 1.001, 0.0) == pytest.approx(1e-3 / 1.001)
    assert relative(1e-9, 2e-9, 1.0) == pytest.approx(1e-9)  # a value near 0: measured against the rms
    assert relative(0.0, 0.0, 0.0) == 0.0 and relative(math.inf, math.inf, 1.0) == 0.0
    assert relative(math.nan, 1.0, 1.0) == math.inf and relative(1.0, math.inf, 1.0) == math.inf
    row = {"module": "m", "order": 0, "dtype": "float32", "shape": [2], "tokens": 2, "l2": 2.0, "mean": 0.0,
           "std": 1.0, "min": -1.0, "max": 1.0, "sample": [[1.0, -1.0]], "sample_norms": [1.4]}
    assert compare_rows(row, {**row, "tokens": 3})[:2] == (math.inf, "tokens")
    assert compare_rows(row, {**row, "mean": 1e-4})[:2] == (pytest.approx(1e-4), "mean")  # rms = 1
    rel, stat, _, _ = compare_rows(row, {**row, "sample": [[-1.0, 1.0]]})  # a permutation of features: caught
    assert rel == 2.0 and stat.startswith("sample[0]")
    two = {**row, "sample": [[1.0, -1.0], [0.5, 0.5]], "sample_norms": [1.4, 0.7]}  # rows that change places: not
    assert compare_rows(two, {**two, "sample": [[0.5, 0.5], [1.0, -1.0]]})[0] == 0.0


def test_the_command_module_imports_no_torch():
    code = "import sys, verirl.tools.align.activations; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_two_runs_differing_in_rms_norm_eps_diverge_at_the_first_rmsnorm(tmp_path, capsys):
    """Seed 000's second bug, end to end: run A (rms_norm_eps 1e-6) dumps its rollouts and
    activations; run B (1e-5, through model.override_config) replays A's rollouts, so both train on
    identical input ids, and dumps its own; compare-activations names layer 0's first RMSNorm."""
    import json

    from verirl.cli import main

    base = ["train", "trainer.total_steps=1", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=4",
            "eval.before_train=false", "eval.at_end=false", "log.progress=false", "reward.workers=0",
            "trainer.dump_activations={steps: [1], backward: true}"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(base + [f"trainer.run_dir={a}", "trainer.dump_rollouts=true",
                        "model.override_config={rms_norm_eps: 1e-6}"]) == 0
    assert main(base + [f"trainer.run_dir={b}", "rollout.engine=replay", f"rollout.replay_path={a / 'rollouts.jsonl'}",
                        "model.override_config={rms_norm_eps: 1e-5}"]) == 0
    assert json.loads((b / "final" / "config.json").read_text())["rms_norm_eps"] == 1e-5  # recorded in the model
    capsys.readouterr()
    assert main(["compare-activations", str(a / "activations"), str(b / "activations"), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    step = result["steps"][0]
    assert step["forward"]["first"]["module"] == "model.layers.0.input_layernorm"
