"""A discriminative reward model in the trainer's process: the rule ``model``.

A Hugging Face sequence-classification model (``AutoModelForSequenceClassification``: a decoder with a
linear head on its last token, as the reward models of the field ship: Skywork-Reward, ArmoRM,
InternLM2-Reward) reads each (prompt, response) rendered by its own tokenizer's chat template, the
prompt's messages followed by the response as the assistant's turn, and its logit ``reward.model.index``
is the score. A preprocessed dataset's prompt is already templated text (the policy's template): the
response is appended to it as it is.

Sequences are scored in batches of at most ``reward.model.max_token_len`` tokens (rows x the longest
row), longest first, right-padded; the head reads each row's last real token (the pad id given to the
model is one that no row of the batch holds, so a response that ends in the pad token keeps it). A
sequence longer than the budget is not cut: it scores None, with why. Runs under ``inference_mode`` in
the scorer's thread, while the trainer's log-prob passes run.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from verirl.core.errors import ConfigError
from verirl.rewards.service import ServiceScores

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rm_text(tokenizer, prompt, response: str) -> str:
    """The text the reward model reads: the prompt's messages and the response as the assistant's turn
    through the tokenizer's chat template; a templated prompt (text) followed by the response."""
    if isinstance(prompt, str):
        return prompt + response
    messages = [*prompt, {"role": "assistant", "content": response}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


def batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices in batches, longest first, each with rows x its longest row <= budget (a row over the
    budget is left out: the caller scores it None).

    >>> batches([3, 5, 2, 4, 9], 10)
    [[4], [1, 3], [0, 2]]
    """
    order = sorted((i for i, n in enumerate(lengths) if n <= budget), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _absent_id(rows: list[list[int]], vocab: int) -> Optional[int]:
    """A token id below ``vocab`` that no row holds (the pad id given to the head's pooling), or None."""
    seen = {t for r in rows for t in r}
    return next((i for i in range(vocab) if i not in seen), None)


class RewardModelService:
    """The rule ``model``: see the module's docstring."""
    name = "model"

    def __init__(self, cfg, device: str = "cpu", dtype: str = "float32"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(cfg.path or "")
        if not cfg.path or not (path / "config.json").is_file():
            raise ConfigError(f"reward.model.path={cfg.path!r} is not a Hugging Face model directory (no config.json "
                              f"there). Give the directory of a sequence-classification reward model.")
        name = dtype if cfg.dtype == "auto" else cfg.dtype
        if name not in DTYPES:
            raise ConfigError(f"reward.model.dtype={cfg.dtype!r} (model.dtype {dtype!r}) is not one of "
                              f"{', '.join(DTYPES)} / auto.")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[name])
        self.model.eval().requires_grad_(False).to(device)
        labels = self.model.config.num_labels
        if cfg.index >= labels:
            raise ConfigError(f"reward.model.index={cfg.index} but {path}'s head has {labels} logit(s). Give an "
                              f"index below {labels}.")
        self.index, self.budget, self.device = cfg.index, cfg.max_token_len, device
        self._busy: Optional[tuple[int, float]] = None  # (responses, since): what runs now
        self._lock = threading.Lock()

    def encode(self, responses: Sequence[str], samples: Sequence[dict]) -> list[list[int]]:
        """Each (prompt, response)'s token ids as the reward model reads them."""
        out = []
        for response, sample in zip(responses, samples):
            prompt = sample.get("prompt") or ""
            text = rm_text(self.tokenizer, prompt, response)
            templated = not isinstance(prompt, str) and bool(getattr(self.tokenizer, "chat_template", None))
            out.append(self.tokenizer(text, add_special_tokens=not templated)["input_ids"])
        return out

    @torch.inference_mode()
    def forward(self, rows: list[list[int]]) -> list[float]:
        """The head's logit ``index`` at each row's last token, rows scored together (right-padded)."""
        pad = None if len(rows) == 1 else _absent_id(rows, self.model.config.vocab_size)
        if pad is None and len(rows) > 1:  # the rows hold every id of the vocabulary: one at a time
            return [s for r in rows for s in self.forward([r])]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), 0 if pad is None else pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, :len(r)] = torch.tensor(r)
            mask[j, :len(r)] = 1
        self.model.config.get_text_config().pad_token_id = pad  # None: one row, its last token
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return logits[:, self.index].float().cpu().tolist()

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        if self.model is None:
            return ServiceScores([(None, "the reward model was closed")] * len(responses))
        with self._lock:
            self._busy = (len(responses), time.monotonic())
            try:
                rows = self.encode(responses, samples)
                scores: list = [(None, f"{len(r)} tokens, over reward.model.max_token_len={self.budget}")
                                for r in rows]
                for idx in batches([len(r) for r in rows], self.budget):
                    try:
                        out = [(s, "") for s in self.forward([rows[i] for i in idx])]
                    except torch.OutOfMemoryError:  # beside the log-prob passes on one device
                        if torch.cuda.is_available():
                            torch.cuda.empty_cache()
                        longest = max(len(rows[i]) for i in idx)
                        out = [(None, f"out of device memory on a batch of {len(idx)} x {longest} tokens: lower "
                                      f"reward.model.max_token_len ({self.budget})")] * len(idx)
                    for i, scored in zip(idx, out):
                        scores[i] = scored
                return ServiceScores(scores)
            finally:
                self._busy = None

    def outstanding(self) -> list[str]:
        busy = self._busy
        return [] if busy is None else [f"reward model: {busy[0]} responses, {time.monotonic() - busy[1]:.0f} s"]

    def close(self) -> None:
        """Let the weights go (the service scores no more after it)."""
        self.model = None
