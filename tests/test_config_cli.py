"""Bad input gets one paragraph naming the key, the value and the fix; never a traceback."""
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
    with pytest.raises(ConfigError, match="unknown rule 'acc2'.*Known rules"):
        load_config(None, ["reward.verifiers=[acc2]", "reward.weights=[1]", "reward.tasks={}"])
    with pytest.raises(ConfigError, match="one weight per verifier"):
        load_config(None, ["reward.weights=[1.0]"])
    with pytest.raises(ConfigError, match="rollout.n=1"):
        load_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="not one of"):
        load_config(None, ["algo.loss_agg_mode=mean"])


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  lr: 1e-4\n  mini_batch: 4\n")
    with pytest.raises(ConfigError, match=rf"actor.mini_batch.*{bad}.*actor.mini_batch_prompts"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("argv,needle", [
    (["train", "actor.mini_batch_prompts=3"], "not divisible"),
    (["train", "--config", "nope.yaml"], "nope.yaml' does not exist"),
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
    assert needle in err and "Traceback" not in err
    assert err.count("\n") == 1  # one paragraph


def test_help_config_lists_every_section(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    for key in ("prompts_per_step", "mini_batch_prompts", "micro_batch_size", "kl_coef", "dump_rollouts"):
        assert key in out


def test_docs_config_reference_is_current():
    from pathlib import Path

    from verirl.config import markdown_reference
    doc = Path(__file__).resolve().parent.parent / "docs" / "config.md"
    assert doc.read_text() == markdown_reference(), "regenerate: python -m verirl.config > docs/config.md"


def test_too_long_builtin_prompts_can_be_filtered(tmp_path):
    import json
    run = tmp_path / "run"
    assert main(["train", "data.max_prompt_length=30", "data.too_long=filter", f"trainer.run_dir={run}",
                 "trainer.total_steps=1", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "data.val_size=4", "trainer.eval_samples=1", "log.progress=false"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["prompt_length/max"] <= 30
