"""Sharded checkpoints (`verirl.run.shards`): every rank writes the blocks it holds, a resuming rank reads
the pieces that overlap its own, whatever the two layouts; real gloo processes and real training runs of
the tiny model in float32."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ranks import launch
from verirl.cli import main
from verirl.run.checkpoint import check_checkpoint, find_checkpoint

# every layout's blocks put back together against full_tensor(); then a checkpoint written from FSDP2 x TP
# read back into FSDP2 alone, and exported against save_hf's file of the same weights
RANK = r"""
import json, math, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from verirl.models import load_model, save_hf
from verirl.models.parallel import tensor_parallel
from verirl.run.shards import Shards, load_model_blocks, local_blocks, named_tensors, optimizer_state, write_rank, writers
from verirl.train.strategy import full_state_dict, shard

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
ids = torch.randint(1, 366, (2, 12), generator=torch.Generator().manual_seed(0))


def build(layout):
    loaded = load_model("tiny", device="cpu")
    model = loaded.model
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    if layout == "fsdp2":
        shard(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)), torch.device("cpu"))
    if layout in ("tp", "fsdp2_tp"):
        tensor_parallel(model, mesh["tp"])
    if layout == "fsdp2_tp":
        shard(model, mesh["dp"], torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    logits = model(input_ids=ids).logits
    (logits.float().pow(2).mean()).backward()
    opt.step()
    return loaded, model, opt


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def everything(model, opt):
    names = {id(t): n[0] for n, t in named_tensors(model)}
    whole = {(names[id(t)], "weight"): full(t).detach() for n, t in named_tensors(model)}
    for g in opt.param_groups:
        for p in g["params"]:
            for k, v in opt.state[p].items():
                whole[(names[id(p)], k)] = full(v).detach()
    return whole


report = {}
for layout in ("fsdp2", "tp", "fsdp2_tp"):
    loaded, model, opt = build(layout)
    whole = everything(model, opt)
    blocks = local_blocks(model, opt, lambda t: True)
    every = [None] * world
    dist.all_gather_object(every, [(b.key, b.offset, b.size) for b, _ in blocks])
    mine = writers(every)[rank]
    written = [(b, t) for b, t in blocks if (b.key, b.offset, b.size) in mine]
    sharded = {names[0] for names, t in named_tensors(model)
               if isinstance(t, DTensor) and any(p.is_shard() for p in t.placements)}
    whole_of_sharded = [b.key for b, _ in written if b.name in sharded and b.part != "step" and b.size == b.shape]
    parts = [None] * world
    dist.all_gather_object(parts, [(b.name, b.part, b.offset, b.size, t.clone()) for b, t in written])
    if rank == 0:
        worst, elements = 0.0, {}
        rebuilt = {k: torch.full_like(v, float("nan")) for k, v in whole.items()}
        for part in parts:
            for name, kind, offset, size, t in part:
                rebuilt[(name, kind)][tuple(slice(o, o + n) for o, n in zip(offset, size))] = t
                elements[(name, kind)] = elements.get((name, kind), 0) + t.numel()
        exact = all(torch.equal(rebuilt[k], whole[k]) for k in whole)
        once = all(elements.get(k, 0) == whole[k].numel() for k in whole)
        report[layout] = {"exact": exact, "once": once, "pieces": sum(len(p) for p in parts), "keys": len(whole)}
    report.setdefault("whole_of_sharded", {})[layout] = whole_of_sharded
    report.setdefault("written", {})[layout] = len(written)
    if layout == "fsdp2_tp":
        tied = {alias: names[0] for names, _ in named_tensors(model) for alias in names[1:]}
        write_rank(out / "ckpt", rank, world, written, tied)
        weights = full_state_dict(model)
        dist.barrier()
        if rank == 0:
            from verirl.run.shards import write_safetensors
            save_hf(model, loaded.tokenizer, out / "whole", loaded.stop_ids, weights)
            write_safetensors(Shards(out / "ckpt", world), out / "sharded.safetensors")
        saved = whole
# read the FSDP2 x TP checkpoint into FSDP2 over 4 ranks: every weight and optimizer state equal
loaded = load_model("tiny", device="cpu")
model = shard(loaded.model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)), torch.device("cpu"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
shards = Shards(out / "ckpt", world)
found = load_model_blocks(shards, model, lambda t: True)
opt.load_state_dict(optimizer_state(shards, opt, found, lambda t: True, opt.state_dict()["param_groups"]))
back = everything(model, opt)
report["reloaded"] = sorted(back) == sorted(saved) and all(torch.equal(back[k], saved[k]) for k in saved)
report["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
if rank == 0:
    print("RESULT", json.dumps(report), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_blocks_put_back_together_equal_the_whole_tensors_for_fsdp2_tp_and_both(tmp_path):
    """4 gloo ranks: FSDP2 over 4 (uneven rows: 366 = 92 + 92 + 92 + 90), tp2 (replicated over dp2), FSDP2 over
    tp2 (``_StridedShard``): the blocks of every weight and AdamW state, each written once, rebuild
    full_tensor() exactly, and no rank writes the whole of a tensor it only shards. The FSDP2 x TP checkpoint
    read into FSDP2 alone gives back every tensor exactly (the tie kept), and its export is save_hf's file of
    the same weights byte for byte."""
    outs = launch(tmp_path, RANK, 4, str(tmp_path))
    result = json.loads(next(line for line in outs[0].splitlines() if line.startswith("RESULT")).split(" ", 1)[1])
    for layout in ("fsdp2", "tp", "fsdp2_tp"):
        assert result[layout]["exact"] and result[layout]["once"], (layout, result[layout])
        assert result["whole_of_sharded"][layout] == [], layout
    assert result["reloaded"] and result["tied"]
    assert (tmp_path / "sharded.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()


# training end to end: float32, a token budget (a pipeline pads every micro-batch to it), an lr at which 3 steps
# move the weights (another layout sums in another order: within 1e-4, as tests/test_tensor_parallel.py says)
TRAIN = ["train", "trainer.save_freq=1", "trainer.keep_checkpoints=3", "data.prompts_per_step=4",
         "actor.mini_batch_prompts=4", "rollout.n=8", "eval.before_train=false", "eval.at_end=false",
         "log.progress=false", "log.console_every=0", "reward.workers=0", "algo.kl_coef=0.01", "actor.lr=7e-5",
         "trainer.threads=1", "trainer.dist_timeout_s=60", "model.compute_dtype=null",
         "actor.max_token_len_per_device=256"]
KEYS = ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/entropy", "response_length/mean")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _close(a: dict, b: dict) -> None:
    for key in KEYS:
        assert abs(a[key] - b[key]) <= 1e-4 * abs(a[key]) or abs(a[key] - b[key]) < 1e-6, (key, a[key], b[key])


def _step(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def _pieces(ckpt: Path) -> dict[int, dict]:
    return {int(f.stem.removeprefix("rank")): json.loads(f.read_text())["pieces"]
            for f in sorted((ckpt / "shards").glob("rank*.json"))}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """One rank, 3 steps, a checkpoint of whole tensors after each."""
    run = tmp_path_factory.mktemp("one") / "run"
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3"]) == 0
    return run


@pytest.fixture(scope="module")
def dp2_tp2(tmp_path_factory) -> Path:
    """dp2 x tp2 (FSDP2 over tensor parallel, 4 ranks), 2 steps: sharded checkpoints (auto)."""
    run = tmp_path_factory.mktemp("dp2tp2") / "run"
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=2", "trainer.nproc_per_node=4",
                         "actor.tensor_parallel_size=2", "actor.strategy=fsdp2", "rollout.tensor_parallel_size=1"]) == 0
    return run


@pytest.mark.slow
def test_a_dp2_tp2_checkpoint_holds_every_rank_s_blocks_and_resumes_on_one_rank(tmp_path, uninterrupted, dp2_tp2):
    """Each of the 4 ranks wrote its blocks, none the whole of a tensor (every one is split by FSDP2 or tp2,
    or both), every element once; one rank continues from it: step 3 within 1e-4 of the uninterrupted run."""
    ckpt = _step(dp2_tp2, 2)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["weights"] == "sharded"
    assert state["layout"] == {"world": 4, "dp": 2, "tp": 2, "sp": 1, "pp": 1, "ep": 1}
    assert not list((ckpt / "model").glob("*.safetensors"))
    pieces = _pieces(ckpt)
    assert sorted(pieces) == [0, 1, 2, 3] and all(pieces.values())
    for rank, mine in pieces.items():
        whole = [k for k, e in mine.items() if e["shape"] and e["size"] == e["shape"]]
        assert whole == [], (rank, whole)
    weights = {e["name"] for mine in pieces.values() for e in mine.values() if e["part"] == "weight"}
    assert len(weights) == 4 * 12 + 2 and "lm_head.weight" not in weights  # the tied output layer once
    assert check_checkpoint(ckpt) == (None, True)
    run = tmp_path / "run"
    shutil.copytree(dp2_tp2, run)
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3"]) == 0
    a, b = _metrics(uninterrupted), _metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    _close(a[2], b[2])


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dp2_tp2", "uninterrupted"])
def test_a_dp2_tp2_or_one_rank_checkpoint_resumes_on_tp2_pp2(tmp_path, request, uninterrupted, source):
    """A checkpoint read by tp2 x pp2 (4 ranks, ddp): the dp2 x tp2 one (each rank takes its stages' layers,
    each cut to its tensor-parallel columns or rows, from the pieces that overlap them) and the one-rank run's
    of step 2 (whole tensors, each rank cutting its share from them); step 3 within 1e-4 of the uninterrupted
    run, and its own checkpoint sharded by stage and by column."""
    run = tmp_path / "run"
    if source == "dp2_tp2":
        shutil.copytree(request.getfixturevalue("dp2_tp2"), run)
    else:  # the uninterrupted run as it stood after step 2: its step 3 checkpoint and final/ left out
        shutil.copytree(uninterrupted, run, ignore=lambda d, names: {"step_000003", "final"} & set(names))
        (run / "checkpoints" / "latest").write_text("step_000002")
        state = json.loads((_step(run, 2) / "state.json").read_text())
        assert state["world_size"] == 1 and "weights" not in state  # one file of whole tensors
        assert (_step(run, 2) / "model" / "model.safetensors").exists()
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.nproc_per_node=4",
                         "actor.tensor_parallel_size=2", "actor.pipeline_parallel_size=2", "actor.strategy=ddp",
                         "rollout.tensor_parallel_size=1"]) == 0
    a, b = _metrics(uninterrupted), _metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    _close(a[2], b[2])
    state = json.loads((_step(run, 3) / "state.json").read_text())
    assert state["layout"] == {"world": 4, "dp": 1, "tp": 2, "sp": 1, "pp": 2, "ep": 1}
    assert check_checkpoint(_step(run, 3)) == (None, True)


@pytest.mark.slow
def test_a_dp4_checkpoint_resumes_on_pp2_dp2_with_fsdp2_inside_the_stages(tmp_path, uninterrupted):
    """dp4 (FSDP2 over 4 ranks) saves; pp2 x dp2 continues, each stage FSDP2-sharded over its two
    data-parallel ranks, each rank taking its stage's rows from the dp4 pieces that overlap them: step 3
    within 1e-4 of the uninterrupted run; its own checkpoint holds each stage's tensors in two row pieces."""
    run = tmp_path / "run"
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=2", "trainer.nproc_per_node=4"]) == 0
    assert json.loads((_step(run, 2) / "state.json").read_text())["layout"]["dp"] == 4
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.nproc_per_node=4",
                         "actor.pipeline_parallel_size=2", "actor.strategy=fsdp2"]) == 0
    a, b = _metrics(uninterrupted), _metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    _close(a[2], b[2])
    ckpt = _step(run, 3)
    assert json.loads((ckpt / "state.json").read_text())["layout"] == {"world": 4, "dp": 2, "tp": 1, "sp": 1, "pp": 2,
                                                                       "ep": 1}
    assert check_checkpoint(ckpt) == (None, True)
    pieces = _pieces(ckpt)
    first = [e for e in pieces[0].values() if e["name"].endswith(".layers.0.mlp.up_proj.weight") and e["part"] == "weight"]
    (up,) = first  # rank 0 (dp 0, stage 0) holds the first half of its rows, rank 2 (dp 1, stage 0) the rest
    assert up["offset"][0] == 0 and 2 * up["size"][0] == up["shape"][0], up
    assert any(e["name"] == up["name"] and e["offset"][0] == up["size"][0] for e in pieces[2].values())
    assert not any(".layers.0." in e["name"] for r in (1, 3) for e in pieces[r].values())  # stage 1's ranks


@pytest.mark.slow
def test_export_of_the_dp2_tp2_checkpoint_equals_the_one_rank_export(tmp_path, uninterrupted, dp2_tp2):
    """`verirl export` of the sharded checkpoint: Hugging Face safetensors that transformers loads, the same
    tensors as the one-rank run's export of its step 2 (within 1e-4 of the largest weight: two steps at lr 7e-5, another layout sums in another order; measured 8e-5), and
    byte for byte the run's own final/ (written from that checkpoint, nothing gathered)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, ref = tmp_path / "sharded", tmp_path / "whole"
    assert main(["export", str(_step(dp2_tp2, 2)), str(out)]) == 0
    assert main(["export", str(_step(uninterrupted, 2)), str(ref)]) == 0
    wa, wb = load_file(str(ref / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(wa) == sorted(wb) and "lm_head.weight" not in wb
    for name in wa:
        assert wa[name].dtype == wb[name].dtype and wa[name].shape == wb[name].shape, name
        assert (wa[name] - wb[name]).abs().max() <= 1e-4 * wa[name].abs().max(), name  # 2 steps at lr 7e-5
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    assert (out / "model.safetensors").read_bytes() == (dp2_tp2 / "final" / "model.safetensors").read_bytes()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    sd = model.state_dict()
    assert all(torch.equal(sd[k], wb[k]) for k in wb) and torch.equal(sd["lm_head.weight"], wb["model.embed_tokens.weight"])


@pytest.mark.slow
def test_a_damaged_or_missing_rank_shard_fails_verification_naming_the_file(tmp_path, dp2_tp2):
    from verirl.run.checkpoint import write_manifest

    run = tmp_path / "run"
    shutil.copytree(dp2_tp2, run)
    ckpt = _step(run, 2)
    (ckpt / "shards" / "rank00002.safetensors").unlink()
    problem, _ = check_checkpoint(ckpt)
    assert problem == "shards/rank00002.safetensors is missing", problem
    assert find_checkpoint(run) == _step(run, 1)  # the run goes on from the one before
    same = _step(run, 1) / "shards" / "rank00001.safetensors"
    data = bytearray(same.read_bytes())
    data[-8:] = bytes(8)
    same.write_bytes(bytes(data))
    assert "shards/rank00001.safetensors does not match its checksum" in check_checkpoint(_step(run, 1))[0]
    # an index that lost a piece, its manifest rewritten to match: the coverage check names the tensor
    index = _step(dp2_tp2, 2) / "shards" / "rank00003.json"
    fresh = tmp_path / "fresh"
    shutil.copytree(_step(dp2_tp2, 2), fresh)
    body = json.loads(index.read_text())
    key = next(iter(body["pieces"]))
    lost = body["pieces"].pop(key)
    (fresh / "shards" / "rank00003.json").write_text(json.dumps(body))
    write_manifest(fresh)
    problem, _ = check_checkpoint(fresh)
    assert f"the pieces of {lost['name']} ({lost['part']}) hold" in problem, problem


@pytest.mark.slow
def test_kill_9_of_a_rank_during_a_sharded_save_keeps_the_previous_and_pp2_resumes_dp2(tmp_path, uninterrupted,
                                                                                         monkeypatch):
    """dp2 (FSDP2) saves sharded after steps 1 and 2; rank 1 is killed (SIGKILL) inside the save of step 3,
    after writing its shards: step_000003.tmp stays unfinished and step 2 is the checkpoint chosen. pp2 (ddp)
    continues from it: step 3 within 1e-4 of the uninterrupted run, its checkpoint sharded by stage."""
    run = tmp_path / "run"
    monkeypatch.setenv("VERIRL_TEST_KILL_IN_SAVE", "3:1")
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.nproc_per_node=2"]) != 0
    monkeypatch.delenv("VERIRL_TEST_KILL_IN_SAVE")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (run / "checkpoints" / "step_000003.tmp" / "shards" / "rank00001.json").exists()
    assert not _step(run, 3).exists() and find_checkpoint(run) == _step(run, 2)
    assert json.loads((_step(run, 2) / "state.json").read_text())["layout"]["dp"] == 2
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.nproc_per_node=2",
                         "actor.pipeline_parallel_size=2", "actor.strategy=ddp"]) == 0
    a, b = _metrics(uninterrupted), _metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    _close(a[2], b[2])
    pieces = _pieces(_step(run, 3))
    names = {r: {e["name"] for e in mine.values()} for r, mine in pieces.items()}
    assert "model.embed_tokens.weight" in names[0] and "model.embed_tokens.weight" not in names[1]  # tied: once
    assert any(".layers.0." in n for n in names[0]) and not any(".layers.0." in n for n in names[1])
    assert "model.norm.weight" in names[1] and not any(".layers.3." in n for n in names[0])


SHARED = r"""
import sys
from pathlib import Path
import torch.distributed as dist
from verirl.core.errors import CheckpointError
from verirl.train.checkpoint import check_shared_run_dir
from verirl.train.distributed import Dist

dist.init_process_group("gloo")
rank = dist.get_rank()
ranks = Dist(rank, dist.get_world_size(), rank, dist.get_world_size())
check_shared_run_dir(Path(sys.argv[1]), ranks)  # one directory: passes
try:  # each rank its own directory, as on two nodes without a shared file system
    check_shared_run_dir(Path(sys.argv[1]) / f"node{rank}", ranks)
    print("RESULT passed", flush=True)
except CheckpointError as e:
    print("RESULT", e, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_run_directory_some_rank_cannot_see_is_refused_with_one_paragraph(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir()
    outs = launch(tmp_path, SHARED, 2, str(tmp_path))
    for out in outs:
        said = next(line for line in out.splitlines() if line.startswith("RESULT"))
        assert f"trainer.run_dir {tmp_path}/node" in said and "is not one directory that every rank sees" in said
        assert "and rank 1 (" in said and "cannot read it there" in said and "set trainer.run_dir" in said, said
    assert sorted(p.name for p in tmp_path.rglob(".shared-check-*")) == []  # the token file removed
