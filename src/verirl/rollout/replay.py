"""`rollout.engine=replay`: the responses of each step come from a dump instead of being sampled,
so two runs (on two machines, or two systems) train on identical input ids.

A dump is either verirl's own RUN_DIR/rollouts.jsonl (`trainer.dump_rollouts=true`: one line per
response with ``step``, ``prompt_ids`` and ``response_ids``, replayed exactly), or another system's
JSONL of text: one line per response with a step (``step``; or a folder of ``STEP.jsonl`` files,
as veRL's ``trainer.rollout_data_dir`` writes), the prompt (``prompt`` or ``input``), the response
(``response`` or ``output``) and optionally ``label`` (or ``gts`` / ``answer``), ``task`` (or
``data_source``) and ``stopped``. Text is re-encoded with the run's tokenizer, and the end-of-sequence
token that decoded text loses is appended when the response ended on it: per the line's
``stopped`` field, else per ``rollout.replay_eos`` (``length``: when it is shorter than
rollout.max_new_tokens; ``always``; ``never``).

Within a step the lines are in the order of the step's global batch, ``rollout.n`` per prompt.
With ``rollout.replay_prompts=data`` (default) the prompts come from the run's data as usual and
each must match the dump's at that step (an error names the line otherwise); with ``dump`` the
prompts and labels are the dump's (`dump_prompts`). The engine has no sampling log-probs: a check
that needs them (the vLLM engine's log-prob comparison) is off with it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from verirl.core.errors import DataError
from verirl.core.registry import Registry
from verirl.rollout.base import SamplingParams, left_pad, right_pad
from verirl.core.types import Prompt, Rollout

REPLAY_PROMPTS = Registry("rollout.replay_prompts", {
    "data": "the run's own prompts, each checked against the dump's at that step",
    "dump": "the dump's prompts and labels, in its order"})
REPLAY_EOS = Registry("rollout.replay_eos", {
    "length": "a text response without a stopped field ended on EOS when shorter than rollout.max_new_tokens",
    "always": "every text response ended on EOS", "never": "no text response ended on EOS"})


@dataclass(frozen=True)
class DumpLine:
    where: str  # FILE:LINE, for messages
    step: int
    prompt_ids: Optional[list[int]]  # verirl's dump: exact ids; else None (re-encoded from prompt_text)
    prompt_text: str
    response_ids: Optional[list[int]]
    response_text: str
    label: str
    task: str
    stopped: Optional[bool]
    episode: Optional[dict] = None  # a multi-turn episode's record: segments, turns, tool_counts, env_reward


def _first(row: dict, keys: Sequence[str], default=None):
    return next((row[k] for k in keys if k in row), default)


def read_dump(path: str) -> dict[int, list[DumpLine]]:
    """The dump's lines by step, each step's in file order."""
    p = Path(path)
    if p.is_dir():
        files = sorted((f for f in p.glob("*.jsonl") if f.stem.isdigit()), key=lambda f: int(f.stem))
        if not files:
            raise DataError(f"rollout.replay_path='{path}' is a folder without STEP.jsonl files (e.g. 1.jsonl).")
    elif p.is_file():
        files = [p]
    else:
        raise DataError(f"rollout.replay_path='{path}' does not exist. Give a rollouts.jsonl (trainer.dump_rollouts=true "
                        f"writes one) or a folder of STEP.jsonl files.")
    steps: dict[int, list[DumpLine]] = {}
    for f in files:
        for n, raw in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not raw.strip():
                continue
            where = f"{f}:{n}"
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not a JSON object ({e.msg}). Each line of a rollout dump is one response.")
            step = _first(row, ("step", "global_step", "training/global_step"),
                          int(f.stem) if f.stem.isdigit() else None)  # a STEP.jsonl file names its step
            prompt = _first(row, ("prompt", "input"))
            response = _first(row, ("response", "output"))
            if step is None or prompt is None or response is None:
                raise DataError(f"{where}: a dump line needs a step (step), a prompt (prompt or input) and a response "
                                f"(response or output); it has {sorted(row)}.")
            stopped = row.get("stopped")
            steps.setdefault(int(step), []).append(DumpLine(
                where, int(step), row.get("prompt_ids"), str(prompt), row.get("response_ids"), str(response),
                str(_first(row, ("label", "gts", "answer"), "")), str(_first(row, ("task", "data_source"), "default")),
                None if stopped is None else bool(stopped), _episode(row, where)))
    return steps


def _episode(row: dict, where: str) -> Optional[dict]:
    """A multi-turn record's episode fields, checked: ``segments`` are [role, tokens] runs that cover
    ``response_ids`` exactly."""
    if "segments" not in row:
        return None
    segments, ids = row["segments"], row.get("response_ids")
    ok = isinstance(segments, list) and all(
        isinstance(s, list) and len(s) == 2 and s[0] in ("assistant", "observation") and isinstance(s[1], int)
        and s[1] > 0 for s in segments)
    if not ok or ids is None or sum(s[1] for s in segments) != len(ids):
        raise DataError(f"{where}: a multi-turn record's segments must be [role, tokens] runs (role assistant or "
                        f"observation) covering its response_ids exactly; this one has segments={str(segments)[:120]} "
                        f"for {len(ids or [])} response ids. Replay a rollouts.jsonl that verirl wrote.")
    return {"segments": [list(x) for x in segments], "turns": sum(1 for x in segments if x[0] == "assistant"),
            "counts": dict(row.get("tool_counts") or {}), "env_reward": float(row.get("env_reward", 0.0)),
            "answer": str(row.get("response", ""))}


def _loss_mask(segments: list) -> list[int]:
    """An episode's loss mask from its segments: 1 on the assistant's tokens, 0 on the observations'."""
    return [int(role == "assistant") for role, length in segments for _ in range(length)]


def dump_prompts(steps: dict[int, list[DumpLine]], n: int, tokenizer) -> list[Prompt]:
    """``rollout.replay_prompts=dump``: one prompt per group of ``n`` lines, step by step, for a
    sequential sampler: the run then draws the dump's prompts in the dump's order."""
    out = []
    for step in sorted(steps):
        lines = steps[step]
        if len(lines) % n:
            raise DataError(f"{lines[0].where}: step {step} has {len(lines)} responses, not a multiple of "
                            f"rollout.n={n}. Set rollout.n to the dump's group size.")
        for g in range(0, len(lines), n):
            line = lines[g]
            ids = line.prompt_ids if line.prompt_ids is not None else _encode(tokenizer, line.prompt_text)
            out.append(Prompt(messages=[], label=line.label, task=line.task, ids=list(ids)))
    return out


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class ReplayEngine:
    """The engine protocol over a dump: `generate` returns the dump's responses for the step in
    ``params.step`` at the prompts' global positions."""

    reads_live_model = False  # the responses come from the dump, not from the model

    def __init__(self, model, pad_id: int, stop_ids: Sequence[int], *, path: str, tokenizer, prompts: str = "data",
                 eos: str = "length"):
        REPLAY_PROMPTS.check(prompts)
        REPLAY_EOS.check(eos)
        self.steps = read_dump(path)
        self.path, self.tokenizer, self.prompts, self.eos = path, tokenizer, prompts, eos
        self.pad_id, self.stop_ids = pad_id, list(stop_ids)
        self.device = next(model.parameters()).device

    def sync_weights(self, model) -> None:
        """Nothing to do: the responses come from the dump."""

    def close(self) -> None:
        """Nothing to release: the dump is read whole at construction."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Optional[Sequence[int]] = None) -> Rollout:
        if params.step is None:
            raise ValueError("the replay engine replays training steps: SamplingParams.step must be set")
        index = list(range(len(prompt_ids))) if prompt_index is None else list(prompt_index)
        lines = self.steps.get(params.step)
        if lines is None:
            raise DataError(f"rollout.replay_path='{self.path}' has no responses for step {params.step} (it has steps "
                            f"{min(self.steps)}..{max(self.steps)}). Lower trainer.total_steps, or resume no further.")
        rows_p, rows_r = [], []
        for ids, g in zip(prompt_ids, index):
            group = lines[g * n:(g + 1) * n]
            if len(group) < n:
                raise DataError(f"rollout.replay_path='{self.path}': step {params.step} has {len(lines)} responses, "
                                f"fewer than the {(g + 1) * n} that prompt {g} x rollout.n={n} needs.")
            for line in group:
                self._check_prompt(line, ids)
                rows_p.append(list(ids))
                rows_r.append(self._response(line, params.max_new_tokens))
        p_ids, p_mask = left_pad(rows_p, self.pad_id, self.device)
        tokens, mask = right_pad(rows_r, self.pad_id)
        # the mask by length, never by id: the pad id may be a stop id (pad == EOS), and a cut
        # response padded with it has still not stopped
        stopped = torch.tensor([bool(r) and r[-1] in self.stop_ids for r in rows_r])
        return Rollout(p_ids, p_mask, tokens.to(self.device), mask.to(self.device), mask.to(self.device, copy=True),
                       stopped.to(self.device))

    def _check_prompt(self, line: DumpLine, ids: Sequence[int]) -> None:
        if line.prompt_ids is not None:
            if list(line.prompt_ids) != list(ids):
                raise DataError(f"{line.where}: the dump's prompt ids differ from the run's prompt at step {line.step} "
                                f"(the data, its order or the template differ; with the built-in task, eval.size too: "
                                f"its held-out split and its training prompts are drawn together, so another eval.size "
                                f"trains other prompts). Use the same data, data.shuffle and eval.size as the dumped run "
                                f"(its config.yaml), or rollout.replay_prompts=dump to take the dump's prompts.")
            return
        decoded = {self.tokenizer.decode(list(ids), skip_special_tokens=s).strip() for s in (False, True)}
        if line.prompt_text.strip() not in decoded:
            raise DataError(f"{line.where}: the dump's prompt {line.prompt_text[:80]!r} is not the run's prompt at step "
                            f"{line.step} ({sorted(decoded)[0][:80]!r}). Use the same data and order (and with the "
                            f"built-in task the same eval.size) as the dumped run, or rollout.replay_prompts=dump to "
                            f"take the dump's prompts.")

    def episodes(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Sequence[int]) -> tuple[Rollout, list[dict]]:
        """A multi-turn dump's episodes for these prompts: the rollout with each episode's loss mask from its
        segments (1 on the assistant's, 0 on the observations' tokens) and each episode's record
        (`DumpLine.episode`). Nothing is run again: the tools' answers are the dump's."""
        lines = self.steps.get(params.step)
        if lines is None:
            raise DataError(f"rollout.replay_path='{self.path}' has no responses for step {params.step}. Lower "
                            f"trainer.total_steps, or resume no further.")
        rows_p, chosen = [], []
        for ids, g in zip(prompt_ids, prompt_index):
            group = lines[g * n:(g + 1) * n]
            if len(group) < n or any(line.episode is None for line in group):
                raise DataError(f"rollout.replay_path='{self.path}': step {params.step} prompt {g}: no multi-turn "
                                f"records for its {n} samples (a multi-turn replay needs the rollouts.jsonl of a "
                                f"multi-turn run: records with segments).")
            for line in group:
                if self.prompts == "data":
                    self._check_prompt(line, ids)
                if len(line.response_ids) > params.max_new_tokens:
                    raise DataError(f"{line.where}: the episode is {len(line.response_ids)} response tokens, over "
                                    f"rollout.max_new_tokens={params.max_new_tokens} (what the update is laid out "
                                    f"for). Replay with the dumped run's rollout.max_new_tokens (its config.yaml).")
                rows_p.append(list(ids))
                chosen.append(line)
        p_ids, p_mask = left_pad(rows_p, self.pad_id, self.device)
        tokens, mask = right_pad([line.response_ids for line in chosen], self.pad_id)
        loss, _ = right_pad([_loss_mask(line.episode["segments"]) for line in chosen], 0)
        stopped = torch.tensor([bool(line.stopped) for line in chosen])
        rollout = Rollout(p_ids, p_mask, tokens.to(self.device), mask.to(self.device), loss.to(self.device),
                          stopped.to(self.device))
        return rollout, [line.episode for line in chosen]

    def _response(self, line: DumpLine, max_new_tokens: int) -> list[int]:
        """The response's ids, at most ``max_new_tokens`` and up to its first stop token, with the EOS a
        text dump lost put back."""
        if line.response_ids is not None:
            return self._to_first_stop(list(line.response_ids)[:max_new_tokens])
        ids = _encode(self.tokenizer, line.response_text)
        ended = line.stopped if line.stopped is not None else (
            self.eos == "always" or (self.eos == "length" and len(ids) < max_new_tokens))
        if ended and (not ids or ids[-1] not in self.stop_ids):
            eos = self.tokenizer.eos_token_id
            ids = ids + [eos if eos in self.stop_ids else self.stop_ids[0]]
        return self._to_first_stop(ids[:max_new_tokens])

    def _to_first_stop(self, ids: list[int]) -> list[int]:
        """A response ends at its first stop token, as a sampled one does."""
        first = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        return ids if first is None else ids[:first + 1]
