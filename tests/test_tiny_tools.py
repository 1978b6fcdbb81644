"""The shipped tiny-tools model: its tool-call tokens, stop ids and chat template, the SFT episodes'
tokens and loss mask (those of the multi-turn loop), a deterministic tokenizer rebuild, and a greedy
calculator call from the shipped warm start."""
import warnings

import pytest

from verirl.data import encode_prompts
from verirl.data.tasks import TASKS, TOOLS_RESERVE, arith_tools_split, reference_turns
from verirl.models.tiny import TOOL_TAGS, build_tools_tokenizer, tools_stop_ids
from verirl.rollout.render import TurnRenderer, encode
from verirl.train.sft import episode_trace, local_calculator


@pytest.fixture(scope="module")
def tools_lm():
    from verirl.models import load_model

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lm = load_model("tiny-tools")
    assert not [w for w in seen if "EOS ids disagree" in str(w.message)]  # every stop id in generation_config.json
    return lm


@pytest.fixture(scope="module")
def held_out(tools_lm):
    _, val = arith_tools_split(0, 0, 8)
    return encode_prompts(val, tools_lm.tokenizer, 96)


def test_tool_tags_are_single_tokens_that_survive_decoding(tools_lm):
    tok = tools_lm.tokenizer
    for tag in TOOL_TAGS + ["<think>", "</think>", "<answer>", "</answer>"]:
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [tag], tag
        assert tag not in tok.all_special_tokens
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "4821*317"}}</tool_call>'
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens(tok("1528257", add_special_tokens=False)["input_ids"]) == list("1528257")


def test_stop_ids_are_pad_end_of_turn_and_end_of_call(tools_lm):
    tok = tools_lm.tokenizer
    assert tools_lm.stop_ids == tools_stop_ids(tok) == sorted(
        [tok.pad_token_id, tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("</tool_call>")])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert sorted(tools_lm.model.generation_config.eos_token_id) == tools_lm.stop_ids


def test_chat_template_renders_tool_messages_as_qwen_does(tools_lm):
    tok = tools_lm.tokenizer
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "4821*317"}}</tool_call>'
    msgs = [{"role": "user", "content": "4821 * 317 = ?"}, {"role": "assistant", "content": call},
            {"role": "tool", "name": "calculator", "content": "1528257"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\n4821 * 317 = ?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>1528257</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    two = msgs + [{"role": "tool", "name": "calculator", "content": "7"}]  # consecutive tool messages: one user turn
    assert tok.apply_chat_template(two, tokenize=False).endswith(
        "<|im_start|>user\n<tool_response>1528257</tool_response>\n<tool_response>7</tool_response><|im_end|>\n")
    schema = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]  # tools= is not rendered
    assert tok.apply_chat_template(msgs[:1], tools=schema, tokenize=False) == tok.apply_chat_template(
        msgs[:1], tokenize=False)


def test_tokenizer_rebuild_matches_shipped(tools_lm):
    a, b = build_tools_tokenizer(seed=0), build_tools_tokenizer(seed=0)
    assert a.get_vocab() == b.get_vocab() == tools_lm.tokenizer.get_vocab()
    assert a.chat_template == tools_lm.tokenizer.chat_template


def test_held_out_split_is_drawn_first_and_never_trained_on():
    train, val = arith_tools_split(0, 3000, 50)
    _, more = TASKS["arith_tools"](0, 10, 200)  # GRPO's eval.size may differ from SFT's val_size
    assert [p.messages for p in more[:50]] == [p.messages for p in val]
    _, reserve = arith_tools_split(0, 0, TOOLS_RESERVE)
    held = {(p.task, p.extra["a"], p.extra["b"]) for p in reserve}
    assert not held & {(p.task, p.extra["a"], p.extra["b"]) for p in train}
    mul = next(p for p in val if p.task == "mul")
    assert 1000 <= mul.extra["a"] <= 9999 and 100 <= mul.extra["b"] <= 999
    assert mul.label == str(mul.extra["a"] * mul.extra["b"]) and "calculator" in mul.messages[0]["content"]


def test_sft_episode_masks_exactly_the_assistant_turns(tools_lm, held_out):
    tok, p = tools_lm.tokenizer, held_out[0]
    renderer = TurnRenderer(tok)
    call, result, answer = reference_turns(p)
    ids, labels = episode_trace(p, [call, result, answer], tok, renderer, tok.convert_tokens_to_ids("<|im_end|>"))
    prompt = renderer.prompt_ids(p.messages)
    turn1 = encode(tok, call["content"])
    observed = renderer.observation_ids(p.messages, [result], turn_tail="</tool_call>")
    turn2 = encode(tok, answer["content"]) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert prompt == p.ids and turn1[-1] == tok.convert_tokens_to_ids("</tool_call>")
    assert ids == prompt + turn1 + observed + turn2
    assert labels == [-100] * len(prompt) + turn1 + [-100] * len(observed) + turn2
    assert tok.decode(observed) == (f"<|im_end|>\n<|im_start|>user\n<tool_response>{p.label}</tool_response>"
                                    f"<|im_end|>\n<|im_start|>assistant\n")


def test_shipped_model_calls_the_calculator_and_its_episode_is_the_sft_trace(tools_lm, held_out):
    """Greedy episodes of the real multi-turn loop with the real calculator: the first turn is a call the
    hermes parser reads; a right episode is token for token the SFT trace of its problem."""
    from verirl.envs import build_environments
    from verirl.envs.parsers import hermes
    from verirl.rollout import NativeEngine, SamplingParams
    from verirl.rollout.multiturn import MultiTurn, TurnLimits

    tok = tools_lm.tokenizer
    envs = build_environments(["calculator"], "", "auto", tok.chat_template, 10.0, 1, 0, False)
    try:
        engine = NativeEngine(tools_lm.model, tools_lm.pad_id, tools_lm.stop_ids)
        loop = MultiTurn(engine, tok, TurnRenderer(tok, envs.schemas), envs.new, TurnLimits(2, 1, 112, 40, 32),
                         tools_lm.stop_ids, tools_lm.pad_id, workers=1)
        episodes = loop.generate(held_out, 1, SamplingParams(40, 0.0)).episodes
    finally:
        envs.close()
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in envs.schemas}
    well_formed = 0
    for e in episodes:
        first = tok.decode(e.tokens[:e.segments[0][1]], skip_special_tokens=True)
        calls, errors = hermes(first, schemas)
        well_formed += len(calls) == 1 and not errors and local_calculator(first) is not None
    assert well_formed >= len(episodes) // 2
    right = [e for e in episodes if e.answer == f"<answer>\\boxed{{{e.prompt.label}}}</answer>"]
    assert right, "no held-out episode right: the shipped warm start should get about a quarter right"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for e in right:
        ids, labels = episode_trace(e.prompt, reference_turns(e.prompt), tok, TurnRenderer(tok), eos)
        assert e.prompt_ids + e.tokens == ids
        assert [0] * len(e.prompt_ids) + e.mask == [int(x != -100) for x in labels]


def test_local_calculator_reads_only_int_products_and_sums():
    call = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'
    assert local_calculator(call.format("4821*317")) == "1528257"
    assert local_calculator(call.format("12345 + 54321")) == "66666"
    for bad in ("4821*317*2", "2**10", "__import__('os')", "4821/317", ""):
        assert local_calculator(call.format(bad)) is None, bad
    assert local_calculator('<tool_call>{"name": "python", "arguments": {"expression": "1+1"}}</tool_call>') is None
    assert local_calculator("<tool_call>not json</tool_call>") is None
    assert local_calculator("<answer>\\boxed{3}</answer>") is None


def test_sft_on_tool_episodes_runs_and_refuses_a_model_without_the_call_stop(tmp_path):
    from verirl.cli import main
    from verirl.config import SFTConfig
    from verirl.core.errors import ConfigError
    from verirl.train.sft import sft

    small = ["max_steps=2", "eval_every=1", "val_size=4", "train_size=64", "batch_size=4", "task=arith_tools"]
    assert main(["sft", "model=tiny-tools", f"out_dir={tmp_path / 'out'}", *small]) == 0
    assert (tmp_path / "out" / "model.safetensors").exists()
    with pytest.raises(ConfigError, match="</tool_call>"):  # the tiny tokenizer has no tool-call stop
        sft(SFTConfig(model="tiny", task="arith_tools", max_steps=1, val_size=4, train_size=8, batch_size=2,
                      out_dir=str(tmp_path / "never")))
    assert not (tmp_path / "never").exists()


def test_a_run_on_tiny_tools_passes_the_checks(tmp_path):
    from verirl.config import load_config
    from verirl.run.checks import check

    cfg = load_config("tiny", ["model.path=tiny-tools", "data.task=arith_tools", "data.max_prompt_length=96",
                               "reward.verifiers=[acc]", "reward.weights=[1.0]", "reward.tasks={}",
                               "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[calculator]",
                               f"trainer.run_dir={tmp_path / 'run'}"])
    check(cfg)
