"""The tokens an observation adds to a multi-turn episode, rendered as the chat template renders them.

A multi-turn episode is one token sequence from the prompt to the end: the tokens the engine sampled,
then each observation (a tool's result, an environment's message) as the chat template would render
that message after that turn, then the template's header of the next assistant turn. Nothing is
decoded and encoded again: the sampled tokens stay as sampled, and only the observation's own text is
turned into tokens.

The observation's tokens are found by rendering the conversation with the last assistant turn's
content replaced by a marker no template changes, and keeping what the template writes after the
marker (the end of the assistant turn, the observation, the next header). What the template writes
after the marker does not depend on the turn's text, so it is the same whatever the model sampled.
When the sampled turn already ends with the template's end-of-turn text (the model stopped on
``<|im_end|>``), that text is not added twice.
"""
from __future__ import annotations

from typing import Optional, Sequence

MARKER = "\u2063verirl-turn\u2063"  # U+2063 (invisible separator): text no chat template rewrites


def render(tokenizer, messages: Sequence[dict], tools: Optional[list] = None, generation_prompt: bool = True,
           **template_kwargs) -> str:
    """The chat template's text of ``messages`` (with the tools' schemas when given)."""
    kw = dict(template_kwargs)
    if tools:
        kw["tools"] = tools
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                         **kw)


def encode(tokenizer, text: str) -> list[int]:
    """``text`` as token ids, the way the chat template's text is encoded (no tokens added around it)."""
    out = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(out)


class TurnRenderer:
    """Observations as tokens for one tokenizer's chat template. ``tools``: the tool schemas the prompt
    was rendered with (some templates render tool messages differently when tools are declared)."""

    def __init__(self, tokenizer, tools: Optional[list] = None, **template_kwargs):
        self.tokenizer, self.tools, self.kwargs = tokenizer, tools, template_kwargs

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        """The prompt's tokens: ``messages`` and the first assistant header."""
        return encode(self.tokenizer, render(self.tokenizer, messages, self.tools, True, **self.kwargs))

    def observation_ids(self, history: Sequence[dict], observation: Sequence[dict], turn_tail: str = "") -> list[int]:
        """The tokens after an assistant turn: its end as the template writes it, the ``observation``
        messages, and the next assistant header. ``history``: the conversation before the turn (the
        prompt's messages, earlier turns and observations); ``turn_tail``: the text of the turn's last
        sampled token when it is a stop token: when the template's text after the turn starts with it
        (the end-of-turn token the model stopped on), it is not added again."""
        text = render(self.tokenizer, [*history, {"role": "assistant", "content": MARKER}, *observation], self.tools,
                      True, **self.kwargs)
        at = text.rfind(MARKER)
        if at < 0:
            raise ValueError("the chat template dropped the assistant turn's content; verirl cannot place the "
                             "observation after it (docs/agents.md, 'Chat templates')")
        after = text[at + len(MARKER):]
        if turn_tail and after.startswith(turn_tail):
            after = after[len(turn_tail):]
        return encode(self.tokenizer, after)
