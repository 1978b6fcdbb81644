"""Bad input gets one paragraph naming the key, the value and the fix; never a traceback."""
import re
import subprocess
import sys

import pytest

from verirl.cli import main
from verirl.config import Config, ConfigError, load_config


def test_defaults_are_valid_and_overrides_apply():
    cfg = load_config(None, ["actor.lr=3e-4", "reward.verifiers=[acc,format]", "reward.weights=[1,0.5]"])
    assert isinstance(cfg, Config) and cfg.actor.lr == 3e-4 and cfg.reward.weights == [1.0, 0.5]


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"Unknown config key 'actor.lrr'.*actor.lr"):
        load_config(None, ["actor.lrr=1e-4"])
    with pytest.raises(ConfigError, match=r"rollout.n"):
        load_config(None, ["rolout.n=4"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"rollout.n"):
        load_config(None, ["rollout.n=eight"])


def test_impossible_batch_shape_spells_out_the_arithmetic():
    with pytest.raises(ConfigError, match=r"prompts_per_step=8 is not divisible by actor.mini_batch_prompts=3.*8 / 3"):
        load_config(None, ["actor.mini_batch_prompts=3"])


def test_other_refusals():
    with pytest.raises(ConfigError, match="one weight per verifier"):
        load_config(None, ["reward.weights=[1.0]"])
    with pytest.raises(ConfigError, match="rollout.n=1"):
        load_config(None, ["rollout.n=1"])
    for key in ("actor.lr=inf", "algo.clip_ratio_high=nan", "actor.betas=[0.9,inf]"):
        with pytest.raises(ConfigError, match="not a finite number"):
            load_config(None, [key])


def test_verirl_train_alone_runs_the_tiny_recipe(tmp_path, capsys):
    from verirl.config import to_yaml

    run = tmp_path / "r"
    overrides = [f"trainer.run_dir={run}", "trainer.total_steps=1", "eval.before_train=false", "eval.at_end=false",
                 "log.progress=false", "data.prompts_per_step=2", "actor.mini_batch_prompts=2"]
    assert main(["train", *overrides]) == 0
    assert (run / "config.yaml").read_text() == to_yaml(load_config("tiny", overrides))
    assert not (run / "rollouts.jsonl").exists()  # only with trainer.dump_rollouts=true
    said = " ".join((lambda c: c.out + c.err)(capsys.readouterr()).split())
    assert "verirl GRPO: model tiny" in said
    assert re.search(r"reward/mean \(first 5 vs last.*│ [+-]\d\.\d{3} │ [+-]\d\.\d{3} │ too few steps │", said), said
    tiny, plain = load_config("tiny"), load_config(None)
    assert tiny.trainer.total_steps == 700 and tiny.algo.kl_coef == 0.001 and tiny.reward.tasks
    assert plain.actor.lr == 1e-6 and plain.rollout.max_new_tokens == 512  # --config FILE starts from these


def test_an_internal_error_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    """A bug inside a phase (here a real torch shape error raised in the update) is not printed as if it
    were the user's mistake: it propagates with its traceback instead of becoming exit 2."""
    import torch

    import verirl.train.step as step

    def broken_update(*args, **kwargs):
        return torch.ones(2, 3) @ torch.ones(2, 3)  # mat1 and mat2 shapes cannot be multiplied

    monkeypatch.setattr(step, "update_policy", broken_update)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        main(["train", f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=1", "eval.before_train=false",
              "log.progress=false", "data.prompts_per_step=2", "actor.mini_batch_prompts=2"])
    assert "verirl train: error" not in capsys.readouterr().err


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  lr: 1e-4\n  mini_batch: 4\n")
    with pytest.raises(ConfigError, match=rf"actor.mini_batch.*{bad}.*actor.mini_batch_prompts"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("argv,needle", [
    (["train", "actor.mini_batch_prompts=3"], "not divisible"),
    (["train", "--config", "nope.yaml"], "nope.yaml' does not exist.*recipe shipped with verirl: tiny"),
    (["train", "model.path=/no/such/model"], "model.path='/no/such/model' is not a directory"),
    (["train", "trainer.total_steps=-1"], "trainer.total_steps=-1 must be > 0"),
    (["train", "algo.kl_coeff=0.1"], "algo.kl_coef"),
    (["train", "data.max_prompt_length=12", "trainer.run_dir={tmp}"], "arith train row 0: prompt is"),
])
def test_cli_prints_one_paragraph_and_exits_2(capsys, tmp_path, argv, needle):
    run_dir = tmp_path / "run"
    assert main([a.replace("{tmp}", str(run_dir)) for a in argv]) == 2
    assert not run_dir.exists()  # nothing is written for a run that cannot start
    err = capsys.readouterr().err
    assert re.search(needle, err) and "Traceback" not in err
    assert err.count("\n") == 1  # one paragraph


def test_help_config_lists_every_section(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    for key in ("prompts_per_step", "mini_batch_prompts", "micro_batch_size", "kl_coef", "dump_rollouts"):
        assert key in out
    for key in ("eval:", "every:", "before_train:", "at_end:", "greedy:"):
        assert key in out
    assert "lr: 1.0e-06" in out  # the defaults, for a real model
    assert main(["train", "--config", "tiny", "--help-config"]) == 0
    assert "lr: 7.0e-05" in capsys.readouterr().out  # resolved for the tiny recipe


def _keys(cls, prefix=""):
    """(dotted key, its dataclasses.Field) for every key and section of ``cls``."""
    from dataclasses import fields, is_dataclass

    for f in fields(cls):
        yield f"{prefix}{f.name}", f
        if isinstance(f.default_factory, type) and is_dataclass(f.default_factory):
            yield from _keys(f.default_factory, f"{prefix}{f.name}.")


def test_every_key_has_a_meaning_and_the_docs_show_it():
    from pathlib import Path

    from verirl.config import PreprocessConfig, SFTConfig, markdown_reference

    doc = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    keys = [*_keys(Config), *_keys(SFTConfig), *_keys(PreprocessConfig)]
    assert len(keys) > 150
    empty = [key for key, f in keys if not f.metadata.get("help", "").strip()]
    assert not empty, f"keys without a meaning in their setting(...): {empty}"
    for key, f in _keys(Config):
        assert " ".join(f.metadata["help"].split()).replace("|", "/") in doc, key
    assert doc == markdown_reference(), "regenerate: python -m verirl.config > docs/config.md"


@pytest.mark.parametrize("override,message", [
    ("trainer.total_steps=0", r"trainer.total_steps=0 must be > 0\."),
    ("eval.top_p=1.5", r"eval.top_p=1.5 must be in \(0, 1\]\."),
    ("algo.clip_ratio_low=-0.1", r"algo.clip_ratio_low=-0.1 must be >= 0\."),
    ("rollout.n=1", r"rollout.n=1 must be >= 2: group advantages compare the samples of one prompt"),
    ("reward.aggregate=mean", r"reward.aggregate='mean' is not a known name; known: sum, normalize_then_sum"),
    ("trainer.on_stall=stop", r"trainer.on_stall='stop' is not a known name; known: warn, abort"),
    ("log.progress=fancy", r"log.progress='fancy' is not a known name; known: auto, rich, plain, off"),
])
def test_declared_bounds_and_names_are_refused_at_load(override, message):
    """The bounds and registries declared in each key's setting(...), checked by one rule over the metadata."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_log_progress_is_read_where_it_is_used_not_rewritten():
    """Loading keeps log.progress as given (YAML's false is the string False); the console resolves it."""
    from rich.console import Console

    from verirl.run.display import progress_mode

    cfg = load_config(None, ["log.progress=false"])
    assert cfg.log.progress == "False"
    assert progress_mode(cfg.log.progress, Console()) == "off"
    assert progress_mode(load_config(None, ["log.progress=true"]).log.progress, Console(force_terminal=True)) == "rich"


def test_too_long_builtin_prompts_can_be_filtered(tmp_path):
    import json
    run = tmp_path / "run"
    assert main(["train", "data.max_prompt_length=30", "data.too_long=filter", f"trainer.run_dir={run}",
                 "trainer.total_steps=1", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "eval.size=4", "eval.n=1", "log.progress=false"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["prompt_length/max"] <= 30


@pytest.mark.parametrize("name,value", [("VERIRL_CUDA_GRAPHS", "off"), ("VERIRL_VARLEN", "flash"),
                                        ("VERIRL_ONEDNN", "no")])
def test_a_misspelled_switch_in_the_environment_stops_the_run(capsys, tmp_path, monkeypatch, name, value):
    """A VERIRL_* switch with a value it does not take is refused at start, naming the variable, the value and
    the values it takes, instead of silently meaning its default (and every reader refuses it too)."""
    from verirl.core.errors import ENV_SWITCHES, env_choice

    monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    assert main(["train", f"trainer.run_dir={run_dir}"]) == 2
    assert not run_dir.exists()
    err = capsys.readouterr().err
    assert f"{name}='{value}'" in err and ", ".join(ENV_SWITCHES[name][1]) in err and err.count("\n") == 1
    assert main(["plan"]) == 2 and name in capsys.readouterr().err  # every command checks them first
    with pytest.raises(ConfigError, match=name):
        env_choice(name)
    monkeypatch.setenv(name, ENV_SWITCHES[name][1][0])
    assert env_choice(name) == ENV_SWITCHES[name][1][0]
    monkeypatch.setenv(name, "")
    assert env_choice(name) == ENV_SWITCHES[name][0]


@pytest.mark.parametrize("where", ["override", "file"])
def test_a_section_given_one_value_is_named(tmp_path, where):
    if where == "override":
        args = (None, ["actor=5"])
        source = r"override 'actor=5'"
    else:
        (tmp_path / "c.yaml").write_text("algo:\n  filter_groups: 3\n")
        args = (str(tmp_path / "c.yaml"), [])
        source = re.escape(f"'{tmp_path / 'c.yaml'}'")
    key = "actor" if where == "override" else "algo.filter_groups"
    with pytest.raises(ConfigError, match=rf"'{key}' in {source} is a section of keys \({key}\.\w+, .*Set one of "
                                          rf"its keys, e.g. {key}\.\w+=\.\.\."):
        load_config(*args)
    assert load_config(None, ["actor={lr: 0.001}"]).actor.lr == 0.001  # a mapping is still a section's value


def test_a_yaml_file_indented_with_a_tab_says_tab(tmp_path):
    f = tmp_path / "tab.yaml"
    f.write_text("actor:\n  lr: 1e-4\nrollout:\n\tn: 4\n")
    with pytest.raises(ConfigError, match=r"(?s)not valid YAML: .* Line 4 is indented with a tab: YAML indents with "
                                          r"spaces only"):
        load_config(str(f))


@pytest.mark.parametrize("override,message", [
    ("reward.workers=-5", r"reward.workers=-5 must be >= -1: give -1 \(one scoring process per core"),
    ("rollout.dtype=bf16", r"rollout.dtype='bf16' is not null \(model.dtype\), compute"),
    ("rollout.dtype=bfloat16", r"rollout.dtype=bfloat16 sets the dtype vLLM decodes in, but rollout.engine=native"),
])
def test_out_of_range_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
    assert load_config(None, ["reward.workers=-1"]).reward.workers == -1


def test_vllm_decodes_in_the_trainers_compute_dtype_when_asked(tiny):
    from verirl.train.build import vllm_dtype

    def dtype(*overrides):
        return vllm_dtype(load_config(None, ["rollout.engine=vllm", *overrides]), tiny.model)

    assert dtype() == "float32" and dtype("rollout.dtype=float16") == "float16"
    assert dtype("rollout.dtype=compute") == "float32"  # no mixed precision: the weights' dtype
    assert dtype("rollout.dtype=compute", "model.compute_dtype=bfloat16") == "bfloat16"


def test_plan_json_into_a_closed_pipe_stops_quietly(monkeypatch, capsys):
    """`verirl plan --json | head`: the reader has gone when the output is written; no BrokenPipeError."""
    import os

    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as pipe:
        monkeypatch.setattr("sys.stdout", pipe)
        assert main(["plan", "--json"]) == 141
    assert "Traceback" not in capsys.readouterr().err


def test_the_first_line_names_the_recipes_algorithm():
    from pathlib import Path

    from verirl.run.display import algorithm_name

    dapo = Path(__file__).resolve().parent.parent / "configs" / "tiny_dapo.yaml"
    assert algorithm_name(load_config(str(dapo)).algo) == "DAPO"
    assert algorithm_name(load_config("tiny").algo) == "GRPO"
    assert algorithm_name(load_config("tiny", ["algo.adv_estimator=rloo", "algo.policy_loss=gspo"]).algo) == \
        "RLOO (gspo loss)"


def test_a_checkpoint_config_with_an_earlier_verirls_names_resumes_without_settings_differ():
    """The resume path (`verirl.train.checkpoint.restore`) reads the checkpoint's config through upgrade_dict: the names an
    earlier verirl wrote are today's, so an unchanged run lists no changed settings."""
    from verirl.config import to_dict, upgrade_dict
    from verirl.train.checkpoint import config_changes

    now = to_dict(load_config("tiny"))
    old = {section: dict(values) for section, values in now.items()}
    old["trainer"].update(eval_samples=old["eval"]["n"], eval_at_start=old["eval"]["before_train"])
    old["data"]["additional_keys"] = old["data"].pop("dataset_additional_keys")
    old["eval"] = {k: v for k, v in old["eval"].items() if k not in ("n", "before_train")}
    assert config_changes(old, now)  # read as it is, the old names look like changed settings
    assert config_changes(upgrade_dict(old), now) == []
    with pytest.raises(ConfigError, match=r"Unknown config key 'trainer.eval_samples'.*Did you mean: eval.n\?"):
        load_config("tiny", ["trainer.eval_samples=3"])  # on the command line, the old name is refused


def test_the_parser_is_built_without_torch():
    """`verirl --help` and a mistyped command answer at once: building the parser (every subcommand's
    flags) imports neither torch nor transformers."""
    code = ("import sys; from verirl.cli import _parser; _parser(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
