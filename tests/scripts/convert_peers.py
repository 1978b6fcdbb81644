"""Run `verirl convert-config` on the peers' real configs and `verirl plan` on what it writes.

    python tests/scripts/convert_peers.py VERL_GIT_DIR MINDSPEED_RL_GIT_DIR [--out DIR]

VERL_GIT_DIR and MINDSPEED_RL_GIT_DIR are git directories of veRL (verl-project/verl) and MindSpeed-RL
(Ascend/MindSpeed-RL) snapshots (bare or not); their HEAD is read. Converted:

* every GRPO / DAPO / PPO YAML in MindSpeed-RL's configs/ (grpo_*, dapo_*, ppo_*), with the model YAML its
  `defaults` names merged under `model:` as Hydra composes it;
* veRL's generated trainer config (verl/trainer/config/_generated_<config-name>.yaml, the script's
  --config-name, ppo_trainer by default) with the overrides of each examples/grpo_trainer/*.sh script.
  The overrides are what the script hands to `python3 -m verl.trainer.main_ppo`: the script runs under
  bash with `python3`, `python` and `uv` replaced by a stub that records its arguments (DEVICE=gpu,
  no network, a scratch HOME), so its variables and arrays expand as they would.

For each: the exit status, the rows by status (an "unknown" row fails), and `verirl plan` on the output
with model.path=tiny and the built-in task (data and eval files, reward files and model are the other
machine's), on one rank with data parallelism alone (the tiny model's 4 heads, 2 key/value heads and 4 layers
take none of the peers' tensor-, sequence- and pipeline-parallel layouts; tests/test_convert_config.py checks
those), the token budgets the group's where sequence parallelism made them each rank's share.
Prints one line per config and a summary; exits 1 when any check fails.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

STUB = r"""#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
if "-m" in args and args[args.index("-m") + 1].startswith("verl."):
    with open(os.environ["CONVERT_PEERS_DUMP"], "w") as f:
        f.write("\0".join(args[args.index("-m") + 2:]))
    sys.exit(0)
sys.exit(1)
"""
# What some scripts take from the user's environment (paths of the other machine, the engine).
SCRIPT_ENV = {"HDFS_ROOT": "/hdfs", "RAY_DATA_HOME": "/data", "DATA_ROOT": "/data", "INFER_BACKEND": "vllm",
              "MODEL_PATH": "/models/model"}
PLAN_OVERRIDES = ["model.path=tiny", "data.train_path=''", "eval.data=''", "data.handler_name=instruction",
                  "data.prompt_type=qwen", "data.map_keys={}", "trainer.nproc_per_node=1", "trainer.nnodes=1",
                  "actor.tensor_parallel_size=1", "actor.sequence_parallel_size=1", "actor.pipeline_parallel_size=1",
                  "actor.pipeline_layers=[]", "actor.pipeline_schedule=1f1b", "rollout.tensor_parallel_size=1",
                  "actor.expert_parallel_size=1", "algo.router_replay=off", "algo.moe_aux_loss_coef=0"]


def git_show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout


def git_ls(git_dir: str, folder: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "--name-only", "HEAD", folder + "/"], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def head(git_dir: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def script_overrides(text: str, work: Path) -> list[str]:
    """The arguments a veRL example script hands to verl.trainer.main_ppo (see the module docstring)."""
    stubs = work / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("python3", "python", "uv"):
        (stubs / name).write_text(STUB.replace("/usr/bin/env python3", sys.executable))
        (stubs / name).chmod(0o755)
    for name in ("hf", "huggingface-cli"):  # model downloads: the model is the other machine's
        (stubs / name).write_text("#!/bin/sh\nexit 0\n")
        (stubs / name).chmod(0o755)
    dump = work / "args"
    dump.unlink(missing_ok=True)
    (work / "run.sh").write_text(text)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(work / "home"), "DEVICE": "gpu",
           "CONVERT_PEERS_DUMP": str(dump), **SCRIPT_ENV}
    subprocess.run(["bash", str(work / "run.sh")], cwd=work, env=env, capture_output=True, timeout=30)
    if not dump.exists():
        raise RuntimeError("the script did not reach `python3 -m verl.trainer.main_ppo`")
    return [a for a in dump.read_text().split("\0") if a]


def config_name(args: list[str]) -> tuple[str, list[str]]:
    """(--config-name's value, the other arguments)."""
    name, rest, skip = "ppo_trainer", [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a.startswith("--config-name="):
            name = a.split("=", 1)[1]
        elif a == "--config-name":
            name, skip = args[i + 1], True
        elif a.startswith("--config-path"):
            skip = "=" not in a
        else:
            rest.append(a)
    if "model_engine=megatron" in rest and name == "ppo_trainer":  # Hydra's group choice: the Megatron config
        name = "ppo_megatron_trainer"
    return name.removesuffix(".yaml"), rest


def verirl(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, standard output, standard error) of `verirl ARGV`, run in this process (one import of verirl
    for every config: the same code as the command line)."""
    from verirl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def run_one(label: str, fmt: str, file: str, overrides: list[str], work: Path) -> dict:
    out = work / (label.replace("/", "_").replace(" ", "_") + ".verirl.yaml")
    rc, stdout, stderr = verirl(["convert-config", "--from", fmt, file, *overrides, "-o", str(out), "--json"])
    result = {"config": label, "convert_rc": rc}
    if rc != 0:
        result["error"] = (stderr or stdout).strip().splitlines()[-1:]
        return result
    table = json.loads(stdout)
    result["counts"] = table["counts"]
    result["unknown"] = [r["key"] for r in table["rows"] if r["status"] == "unknown"]
    rc, stdout, stderr = verirl(["plan", "-c", str(out), *PLAN_OVERRIDES, *plan_budgets(table), *plan_reward(table)])
    result["plan_rc"] = rc
    if rc != 0:
        result["plan_error"] = (stderr or stdout).strip().splitlines()[-1:]
    return result


def plan_budgets(table: dict) -> list[str]:
    """With sequence parallelism the token budgets are each rank's share of the group's: on the one rank `plan`
    runs, the group's (budget x actor.sequence_parallel_size)."""
    sp = int(table["config"].get("actor", {}).get("sequence_parallel_size", 1))
    out = []
    for section, key in (("actor", "max_token_len_per_device"), ("ref", "log_prob_max_token_len_per_device")):
        budget = table["config"].get(section, {}).get(key)
        if sp > 1 and budget:
            out.append(f"{section}.{key}={int(budget) * sp}")
    return out


def plan_reward(table: dict) -> list[str]:
    """What is not here: the other machine's rule file, or a peer's rule verirl has not (a decide row: write it
    for verirl), stands in as verirl's acc; vLLM (not installed here) as the native engine."""
    from verirl.rewards.rules import RULES

    out = []
    verifiers = table["config"].get("reward", {}).get("verifiers")
    if verifiers and any(str(v) not in RULES for v in verifiers):
        out.append("reward.verifiers=[" + ",".join(str(v) if str(v) in RULES else "acc" for v in verifiers) + "]")
        metric = table["config"].get("algo", {}).get("filter_groups", {}).get("metric")
        if metric in verifiers and metric not in RULES:
            out.append("algo.filter_groups.metric=acc")
    if table["config"].get("rollout", {}).get("engine") == "vllm":
        out.append("rollout.engine=native")
    return out


def mindspeed_file(git_dir: str, path: str, work: Path) -> str:
    """The config with its model YAML merged under `model:`, as MindSpeed-RL's Hydra composes it."""
    tree = yaml.safe_load(git_show(git_dir, path))
    for entry in tree.get("defaults") or []:
        if isinstance(entry, dict) and "model" in entry:
            names = entry["model"] if isinstance(entry["model"], list) else [entry["model"]]
            for name in names:
                tree.setdefault("model", {}).update(yaml.safe_load(git_show(git_dir, f"configs/model/{name}.yaml")))
    file = work / Path(path).name
    file.write_text(yaml.safe_dump(tree, sort_keys=False))
    return str(file)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("verl_git_dir")
    p.add_argument("mindspeed_rl_git_dir")
    p.add_argument("--out", default="", help="keep the converted files here (default: a temporary folder)")
    a = p.parse_args()
    work = Path(a.out or tempfile.mkdtemp(prefix="convert_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"veRL {head(a.verl_git_dir)}; MindSpeed-RL {head(a.mindspeed_rl_git_dir)}; files in {work}")
    results = []
    for path in git_ls(a.mindspeed_rl_git_dir, "configs"):
        name = Path(path).name
        if name.endswith(".yaml") and name.split("_")[0] in ("grpo", "dapo", "ppo"):
            results.append(run_one(f"MindSpeed-RL {path}", "mindspeed-rl", mindspeed_file(a.mindspeed_rl_git_dir,
                                                                                         path, work), [], work))
    for path in git_ls(a.verl_git_dir, "examples/grpo_trainer"):
        if not path.endswith(".sh"):
            continue
        label = f"veRL {path}"
        try:
            name, overrides = config_name(script_overrides(git_show(a.verl_git_dir, path), work))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            results.append({"config": label, "convert_rc": None, "error": [str(e)]})
            continue
        if f"verl/trainer/config/_generated_{name}.yaml" not in git_ls(a.verl_git_dir, "verl/trainer/config"):
            name = "ppo_trainer"
        base = work / f"_generated_{name}.yaml"
        base.write_text(git_show(a.verl_git_dir, f"verl/trainer/config/_generated_{name}.yaml"))
        results.append(run_one(label + f" (on _generated_{name}.yaml)", "verl", str(base), overrides, work))
    failed = 0
    for r in results:
        ok = r["convert_rc"] == 0 and not r.get("unknown") and r.get("plan_rc") == 0
        failed += not ok
        print(("ok   " if ok else "FAIL ") + json.dumps(r), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{len(results) - failed} of {len(results)} configs: convert-config exit 0, no unknown row, plan accepts")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
