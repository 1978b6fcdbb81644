"""Multi-turn rollouts: the model calls tools or talks to an environment, reads the result and goes on.

Each sample is an episode, one token sequence from the prompt to the end (token in, token out):

    prompt | turn 1 (sampled, loss mask 1) | observation 1 + next header (loss mask 0) | turn 2 | ...

The sampled tokens are kept as the engine sampled them; an observation is the tool's or the
environment's message rendered as the chat template renders it after that turn
(`verirl.rollout.render`). Nothing sampled is decoded and encoded again, so the tokens trained on
are the tokens sampled, whatever the tokenizer does with their text.

The loop is batched by turns: every episode still going decodes its next turn in one engine call;
as each stops (on the native engine, the moment it samples its stop token, while the others still
decode) its environment step starts in a thread pool (tools that run code run in processes of their
own), and the next call starts once every step of the turn is back. An episode ends when its
environment says so (a turn with no tool call is the answer), at ``max_turns`` assistant turns or
``max_env_turns`` observations, when a turn is cut at its token limit, or when the next observation
would pass ``max_total_tokens``. Sampling is keyed by (seed, global prompt position, sample,
response position), so an episode does not depend on what else is decoded with it, its batch or the
number of ranks. The native engine keeps each episode's KV cache across turns and prefills only the
tokens a turn appends (`verirl.rollout.native.Session`); other engines read the episode's whole prefix
each turn (vLLM's prefix caching keeps that cheap).
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Protocol, Sequence

import torch

from verirl.core.errors import DataError
from verirl.core.types import Prompt, Rollout
from verirl.rollout.base import SamplingParams, left_pad, right_pad
from verirl.rollout.render import TurnRenderer, encode

COUNTS = ("tool_calls", "tool_errors", "parse_errors", "tool_timeouts", "tool_seconds")


class EnvironmentLike(Protocol):
    """What the loop asks of an environment (`verirl.envs.Environment`): one per episode."""

    def reset(self, prompt: Prompt) -> Optional[list[dict]]: ...

    def step(self, turn: str): ...  # -> verirl.envs.EnvStep (observation, reward, done, counts)

    def close(self) -> None: ...


@dataclass(frozen=True)
class TurnLimits:
    """An episode's bounds (rollout.multi_turn.*, resolved)."""
    max_turns: int  # assistant turns
    max_env_turns: int  # observations
    max_total_tokens: int  # response tokens in all, sampled and observed
    max_tokens_per_turn: int  # sampled tokens per turn
    max_observation_tokens: int  # tokens of one observation message's content
    max_prompt_tokens: int = 0  # a prompt with an environment's first observation at most (0: no check)


@dataclass
class Episode:
    """One sample's episode as it grows."""
    prompt: Prompt
    position: int  # the prompt's position in the step's global batch
    sample: int  # the sample's index in its group
    env: EnvironmentLike
    prompt_ids: list[int]
    messages: list[dict]  # the conversation as text: the prompt's messages, turns and observations
    tokens: list[int] = field(default_factory=list)  # response tokens, sampled and observed
    mask: list[int] = field(default_factory=list)  # 1 on sampled tokens
    logps: list[float] = field(default_factory=list)  # the engine's log-prob of each sampled token (0 elsewhere)
    segments: list[list] = field(default_factory=list)  # [role, tokens] runs: assistant / observation
    turns: int = 0
    env_turns: int = 0
    rewards: list[float] = field(default_factory=list)  # the environment's, turn by turn
    counts: Counter = field(default_factory=Counter)
    answer: str = ""  # the last assistant turn's text: what the reward rules score
    stopped: bool = False  # ended on a stop token (not cut at a token limit)
    done: bool = False
    observed: int = 0  # tokens up to the end of the last sampled turn (what follows: the observation appended)

    def add(self, ids: Sequence[int], sampled: bool, logps: Optional[Sequence[float]] = None) -> None:
        self.tokens += list(ids)
        self.mask += [1 if sampled else 0] * len(ids)
        self.logps += list(logps) if logps is not None else [0.0] * len(ids)
        role = "assistant" if sampled else "observation"
        if self.segments and self.segments[-1][0] == role:
            self.segments[-1][1] += len(ids)
        else:
            self.segments.append([role, len(ids)])


@dataclass
class Episodes:
    """A multi-turn rollout: the training record, the answers to score, and what each episode did."""
    rollout: Rollout
    answers: list[str]  # (N,) each episode's last assistant turn, decoded
    episodes: list[Episode]

    def env_rewards(self, how: str) -> list[float]:
        """(N,) what the environment's rewards add to each answer's score: their sum, or the last one."""
        if how == "last":
            return [e.rewards[-1] if e.rewards else 0.0 for e in self.episodes]
        return [float(sum(e.rewards)) for e in self.episodes]


def cut_observation(tokenizer, messages: list[dict], max_tokens: int) -> list[dict]:
    """Each message's content cut to ``max_tokens`` tokens (an observation is not sampled: its text may be
    encoded and cut freely), marked where it was cut."""
    out = []
    for m in messages:
        content = str(m.get("content", ""))
        ids = encode(tokenizer, content)
        if len(ids) > max_tokens:
            content = tokenizer.decode(ids[:max_tokens]) + " ...(cut)"
        out.append({**m, "content": content})
    return out


class MultiTurn:
    """Runs episodes on an engine. ``new_env``: a fresh environment per episode; ``workers``: threads that
    run environment steps while the engine decodes."""

    def __init__(self, engine, tokenizer, renderer: TurnRenderer, new_env: Callable[[], EnvironmentLike],
                 limits: TurnLimits, stop_ids: Sequence[int], pad_id: int, workers: int = 2, continued: bool = True,
                 batch: int = 0):
        self.engine, self.tokenizer, self.renderer, self.new_env = engine, tokenizer, renderer, new_env
        self.limits, self.stop_ids, self.pad_id = limits, set(int(i) for i in stop_ids), pad_id
        self.workers = max(1, workers)
        # continued: an engine that can keep each episode's KV cache across turns does (`open_session`), and
        # prefills only what each turn appends; else every turn prefills the episode's whole prefix
        self.continued = continued
        self.last_prefilled = 0  # tokens the last call prefilled: prompts, then each turn's prefix or appended part
        self.stop_text = {i: tokenizer.decode([i]) for i in self.stop_ids}
        self.last_tool_seconds = 0.0  # the tools' wall-clock time in the last call, summed over episodes
        self.last_hidden_seconds = 0.0  # of that, what ran while the engine was still decoding
        self.batch = batch  # episodes decoded together (whole groups; 0 = all of a call's)
        self._logps = True  # every engine call of the last generate returned its sampled tokens' log-probs

    def generate(self, prompts: Sequence[Prompt], n: int, params: SamplingParams,
                 positions: Optional[Sequence[int]] = None) -> Episodes:
        """``n`` episodes per prompt (at ``positions`` of the step's global batch), contiguous per prompt;
        ``batch`` episodes decode together at a time (whole groups; 0 = all)."""
        positions = list(range(len(prompts))) if positions is None else list(positions)
        self.last_tool_seconds = self.last_hidden_seconds = 0.0
        self.last_prefilled = 0
        self._logps = True
        per = len(prompts) if self.batch <= 0 else max(1, self.batch // n)
        episodes: list[Episode] = []
        for s in range(0, len(prompts), per):  # episodes are keyed one by one: the split changes no token
            episodes += self._episodes(prompts[s:s + per], positions[s:s + per], n, params)
        return Episodes(self._rollout(episodes), [e.answer for e in episodes], episodes)

    def _episodes(self, prompts: Sequence[Prompt], positions: list[int], n: int, params: SamplingParams) -> list[Episode]:
        episodes: list[Episode] = []
        awake = getattr(self.engine, "awake", None)  # vLLM: awake across the turns, the prefixes cached
        try:
            for p, g in zip(prompts, positions):
                for j in range(n):
                    episodes.append(self._start(p, g, j))
            opened = getattr(self.engine, "open_session", None) if self.continued else None
            session = opened([e.prompt_ids for e in episodes], self.limits.max_total_tokens) if opened else None
            with ThreadPoolExecutor(self.workers, thread_name_prefix="verirl-env") as pool, \
                    (awake() if awake is not None else contextlib.nullcontext()):
                live = episodes
                while live:
                    self._turn(live, params, pool, session)
                    going = [i for i, e in enumerate(live) if not e.done]
                    if session is not None and going:
                        session.keep(going)
                        session.extend([live[i].tokens[live[i].observed:] for i in going])
                    live = [live[i] for i in going]
            if session is not None:
                self.last_prefilled += sum(session.prefilled)
        finally:
            for e in episodes:
                e.env.close()
        return episodes

    def _start(self, p: Prompt, position: int, sample: int) -> Episode:
        """A new episode of ``p``: its environment, reset, and its prompt (with the first observation, if any)."""
        env = self.new_env()
        e = Episode(p, position, sample, env, list(p.ids), list(p.messages))
        first = env.reset(p)
        if first:
            if not p.messages:
                raise DataError("rollout.multi_turn.environment: reset(prompt) returned a first observation, but "
                                "this prompt holds token ids only (a preprocessed or replayed data file), so the "
                                "observation cannot be rendered after its messages. Use a raw data file (rendered "
                                "by the tokenizer's chat template), or return no first observation.")
            first = cut_observation(self.tokenizer, list(first), self.limits.max_observation_tokens)
            e.messages += first
            e.prompt_ids = self.renderer.prompt_ids(e.messages)
            if self.limits.max_prompt_tokens and len(e.prompt_ids) > self.limits.max_prompt_tokens:
                raise DataError(f"rollout.multi_turn.environment: the prompt with the environment's first "
                                f"observation is {len(e.prompt_ids)} tokens, over data.max_prompt_length="
                                f"{self.limits.max_prompt_tokens}. Raise data.max_prompt_length, or return a shorter "
                                f"first observation (rollout.multi_turn.max_tool_response_tokens cuts it).")
        return e

    def _turn(self, live: list[Episode], params: SamplingParams, pool: ThreadPoolExecutor, session=None) -> None:
        """One assistant turn of every live episode, each environment step started as its turn stops."""
        L = self.limits
        budgets = [min(L.max_tokens_per_turn, L.max_total_tokens - len(e.tokens)) for e in live]
        pending: dict[int, Future] = {}
        decoded = [float("inf")]  # when the engine's call returned

        def step(i: int, text: str):
            t0 = time.monotonic()
            out = live[i].env.step(text)
            t1 = time.monotonic()
            return out, t0, t1

        def stopped(row: int, toks: list[int]) -> None:
            if len(toks) <= budgets[row] and row not in pending:
                pending[row] = pool.submit(step, row, self._text(toks))

        keys = dict(prompt_index=[e.position for e in live], sample_index=[e.sample for e in live],
                    offset=[len(e.tokens) for e in live])
        turn = replace(params, max_new_tokens=max(budgets))
        if session is not None:  # the cache kept from the last turn: nothing prefilled again
            r = session.turn(turn, on_stop=stopped, budgets=budgets, **keys)
        else:
            self.last_prefilled += sum(len(e.prompt_ids) + len(e.tokens) for e in live)
            kw = {"on_stop": stopped} if _takes(self.engine, "on_stop") else {}
            r = self.engine.generate([e.prompt_ids + e.tokens for e in live], 1, turn, **keys, **kw)
        decoded[0] = time.monotonic()
        self._logps &= r.sample_logprobs is not None
        lengths = r.response_mask.sum(-1).tolist()
        for i, e in enumerate(live):
            toks = r.response_ids[i, :min(int(lengths[i]), budgets[i])].tolist()
            logps = None if r.sample_logprobs is None else r.sample_logprobs[i, :len(toks)].tolist()
            e.add(toks, True, logps)
            e.observed = len(e.tokens)
            e.turns += 1
            e.answer = self._text(toks)
            if not toks or toks[-1] not in self.stop_ids:  # cut at its token limit: the episode ends there
                e.done, e.stopped = True, False
                pending.pop(i, None)
                continue
            if i not in pending:
                pending[i] = pool.submit(step, i, e.answer)
        for i in sorted(pending):
            out, t0, t1 = pending[i].result()
            self.last_tool_seconds += t1 - t0
            self.last_hidden_seconds += max(0.0, min(t1, decoded[0]) - t0)  # the part that ran beside decoding
            self._observe(live[i], out)

    def _observe(self, e: Episode, out) -> None:
        """The environment's answer to ``e``'s last turn: its reward, and its observation appended."""
        L = self.limits
        e.counts.update({k: v for k, v in (out.counts or {}).items() if k in COUNTS})
        if out.reward is not None:
            e.rewards.append(float(out.reward))
        e.stopped = True
        turn = {"role": "assistant", "content": e.answer}
        if out.done or not out.observation or e.turns >= L.max_turns or e.env_turns >= L.max_env_turns:
            e.done = True
            return
        obs = cut_observation(self.tokenizer, list(out.observation), L.max_observation_tokens)
        last = e.tokens[-1]
        ids = self.renderer.observation_ids(e.messages, obs, self.stop_text.get(last, ""))
        if len(e.tokens) + len(ids) >= L.max_total_tokens:  # no room for the observation and a turn after it
            e.done, e.stopped = True, False
            return
        e.add(ids, False)
        e.messages += [turn, *obs]
        e.env_turns += 1

    def _text(self, toks: Sequence[int]) -> str:
        return self.tokenizer.decode(list(toks), skip_special_tokens=True)

    def _rollout(self, episodes: list[Episode]) -> Rollout:
        """The episodes as a training rollout: prompts left-padded, responses right-padded, the loss mask on
        the sampled tokens, the engine's log-probs where it gave them."""
        prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], self.pad_id)
        ids, mask = right_pad([e.tokens for e in episodes], self.pad_id)
        loss, _ = right_pad([e.mask for e in episodes], 0)
        logps, _ = right_pad([e.logps for e in episodes], 0.0, torch.float32)
        stopped = torch.as_tensor([e.stopped for e in episodes], dtype=torch.bool)
        return Rollout(prompt_ids, prompt_mask, ids, mask, loss, stopped, logps if self._logps else None)


def _takes(engine, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


class ReplayedEpisodes:
    """`MultiTurn`'s interface over a multi-turn dump (`rollout.engine=replay`): each step's episodes are the
    dump's, token for token and mask for mask, with the answers, tool counts and environment rewards it
    recorded; no tool or environment runs."""

    def __init__(self, engine):
        self.engine = engine
        self.last_tool_seconds = self.last_hidden_seconds = 0.0
        self.last_prefilled = 0

    def generate(self, prompts: Sequence[Prompt], n: int, params: SamplingParams,
                 positions: Optional[Sequence[int]] = None) -> Episodes:
        positions = list(range(len(prompts))) if positions is None else list(positions)
        rollout, records = self.engine.episodes([p.ids for p in prompts], n, params, positions)
        episodes = []
        for i, rec in enumerate(records):
            p = prompts[i // n]
            e = Episode(p, positions[i // n], i % n, None, rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist(),
                        list(p.messages), segments=[list(s) for s in rec["segments"]], turns=rec["turns"],
                        counts=Counter(rec["counts"]), answer=rec["answer"], stopped=bool(rollout.stopped[i]),
                        done=True)
            e.env_turns = sum(1 for role, _ in e.segments if role == "observation")
            e.rewards = [rec["env_reward"]]
            episodes.append(e)
        return Episodes(rollout, [e.answer for e in episodes], episodes)
