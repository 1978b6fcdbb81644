"""Supervised warm start on a built-in task: how the shipped tiny models are made.

Loss on the response tokens only (worked answer + stop token). Stops once held-out greedy
accuracy reaches ``target_greedy``, because accuracy rises steeply and a step count alone
lands somewhere different on every machine.

A task answered with tools (``arith_tools``, for ``tiny-tools``) is trained on whole episodes, built
token for token as the multi-turn loop builds them (`verirl.rollout.multiturn`): the prompt, the
assistant's call (ending with its stop token ``</tool_call>``), the tool's result as the chat template
renders it after that turn (`TurnRenderer.observation_ids`), the answer and ``<|im_end|>``. The loss is
on the assistant turns only. Its held-out accuracy is that of greedy episodes with a small local
calculator (`local_calculator`), the last turn scored by ``acc``.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Optional

import torch

from verirl.config import SFTConfig
from verirl.core.errors import ConfigError
from verirl.data import TASKS, encode_prompts, reference_response
from verirl.data.tasks import EPISODES
from verirl.envs.base import EnvStep
from verirl.train.evaluate import evaluate
from verirl.models import load_model, save_hf
from verirl.models.tiny import build_model, build_moe_model, build_tokenizer, build_tools_tokenizer, tools_stop_ids
from verirl.rewards.rules import acc as acc_rule
from verirl.rollout import NativeEngine
from verirl.rollout.base import SamplingParams
from verirl.rollout.multiturn import MultiTurn, TurnLimits
from verirl.rollout.render import TurnRenderer, encode
from verirl.train.update import build_optimizer
from verirl.rewards import Scorer
from verirl.train.build import seed_everything


def _pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s, _ in rows)
    ids = torch.full((len(rows), width), pad_id)
    lab = torch.full((len(rows), width), -100)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (s, l) in enumerate(rows):
        ids[i, :len(s)], lab[i, :len(s)], att[i, :len(s)] = torch.tensor(s), torch.tensor(l), 1
    return ids, att, lab


def _batch(prompts, tokenizer, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = []
    for p in prompts:
        resp = tokenizer(reference_response(p), add_special_tokens=False)["input_ids"] + [eos_id]
        rows.append((p.ids + resp, [-100] * len(p.ids) + resp))
    return _pad(rows, pad_id)


def episode_trace(p, turns: list[dict], tokenizer, renderer: TurnRenderer, eos_id: int) -> tuple[list[int], list[int]]:
    """(ids, labels) of one worked episode, as the multi-turn loop would hold it: ``turns`` (the assistant
    turns and the tool messages after the prompt) rendered turn by turn, labels -100 on the prompt and on
    every observation token. An assistant turn followed by tool messages ends with its own last token
    (``</tool_call>``, a stop token); the last turn ends with ``eos_id``."""
    ids = renderer.prompt_ids(p.messages)
    labels = [-100] * len(ids)
    history = list(p.messages)
    i = 0
    while i < len(turns):
        turn = turns[i]
        obs = []
        while i + 1 + len(obs) < len(turns) and turns[i + 1 + len(obs)]["role"] != "assistant":
            obs.append(turns[i + 1 + len(obs)])
        toks = encode(tokenizer, turn["content"])
        if not obs:
            toks = toks + [eos_id]
        ids += toks
        labels += toks
        if obs:
            seen = renderer.observation_ids(history, obs, turn_tail=tokenizer.decode([toks[-1]]))
            ids += seen
            labels += [-100] * len(seen)
        history += [turn, *obs]
        i += 1 + len(obs)
    return ids, labels


_CALL = re.compile(r"<tool_call>(.{0,300}?)</tool_call>", re.S)
_EXPRESSION = re.compile(r"\s*(\d{1,12})\s*([*+])\s*(\d{1,12})\s*")


def local_calculator(turn: str) -> Optional[str]:
    """The result of a turn's calculator call when it is well formed (``<tool_call>`` + JSON with ``name``
    calculator and ``arguments.expression`` = ``int*int`` or ``int+int``), else None. Nothing is evaluated
    as code: the expression is read by a regular expression and computed on ints. SFT's own check only;
    the multi-turn loop runs the real tools of `verirl.envs`."""
    m = _CALL.search(turn)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
    except ValueError:
        return None
    args = call.get("arguments") if isinstance(call, dict) and call.get("name") == "calculator" else None
    expression = args.get("expression") if isinstance(args, dict) else None
    e = _EXPRESSION.fullmatch(expression) if isinstance(expression, str) else None
    if e is None:
        return None
    a, b = int(e.group(1)), int(e.group(3))
    return str(a * b if e.group(2) == "*" else a + b)


class _Calculator:
    """An episode's environment for SFT's check: a well-formed call gets its result, anything else ends
    the episode (the turn is the answer)."""

    def reset(self, prompt) -> None:
        return None

    def step(self, turn: str) -> EnvStep:
        result = local_calculator(turn)
        if result is None:
            return EnvStep(None, done=True)
        return EnvStep([{"role": "tool", "name": "calculator", "content": result}], counts={"tool_calls": 1.0})

    def close(self) -> None:
        pass


def tool_accuracy(engine, tokenizer, prompts, stop_ids: list[int], pad_id: int, max_tokens_per_turn: int = 40) -> dict:
    """Greedy held-out episodes with the local calculator: ``tools`` (the last turn right, by ``acc``),
    ``no_tools`` (the first turn alone right: no tool runs), ``calls`` (share of first turns that are a
    well-formed calculator call)."""
    limits = TurnLimits(max_turns=2, max_env_turns=1, max_total_tokens=2 * max_tokens_per_turn + 32,
                        max_tokens_per_turn=max_tokens_per_turn, max_observation_tokens=32)
    loop = MultiTurn(engine, tokenizer, TurnRenderer(tokenizer), _Calculator, limits, stop_ids, pad_id, workers=1)
    eps = loop.generate(prompts, 1, SamplingParams(max_tokens_per_turn, 0.0)).episodes
    first = [tokenizer.decode(e.tokens[:e.segments[0][1]], skip_special_tokens=True) if e.segments else "" for e in eps]
    n = max(1, len(eps))
    return {"tools": sum(acc_rule(e.answer, e.prompt.label) == 1.0 for e in eps) / n,
            "no_tools": sum(acc_rule(t, e.prompt.label) == 1.0 for t, e in zip(first, eps)) / n,
            "calls": sum(local_calculator(t) is not None for t in first) / n}


def direct_accuracy(engine, tokenizer, prompts, max_new_tokens: int = 16) -> float:
    """Greedy accuracy when the model is made to answer at once (the first turn started with
    ``<answer>\\boxed{``): what it computes in its head."""
    head = encode(tokenizer, "<answer>\\boxed{")
    r = engine.generate([p.ids + head for p in prompts], 1, SamplingParams(max_new_tokens, 0.0))
    lengths = r.response_mask.sum(-1).tolist()
    texts = [tokenizer.decode(head + r.response_ids[i, :int(k)].tolist(), skip_special_tokens=True)
             for i, k in enumerate(lengths)]
    return sum(acc_rule(t, p.label) == 1.0 for t, p in zip(texts, prompts)) / max(1, len(prompts))


def sft(cfg: SFTConfig, console=None) -> dict:
    from rich.console import Console
    console = console or Console()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    if cfg.init == "scratch" and cfg.model == "tiny-tools":
        tokenizer = build_tools_tokenizer(seed=cfg.seed)
        model = build_model(tokenizer, seed=cfg.seed)
        eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        stop_ids = tools_stop_ids(tokenizer)
    elif cfg.init == "scratch":
        tokenizer = build_tokenizer(seed=cfg.seed)
        model = (build_moe_model if cfg.model == "tiny-moe" else build_model)(tokenizer, seed=cfg.seed)
        eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        stop_ids = sorted({eos_id, tokenizer.pad_token_id})
    else:
        lm = load_model(cfg.init)
        model, tokenizer, stop_ids = lm.model, lm.tokenizer, lm.stop_ids
        eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id
    train, val = TASKS[cfg.task](cfg.seed, cfg.train_size, cfg.val_size)
    encode_prompts(train, tokenizer, 512, "sft train")
    encode_prompts(val, tokenizer, 512, "sft val")
    opt, sched = build_optimizer(model, cfg.lr, (0.9, 0.99), 0.0, cfg.warmup_steps)
    engine = NativeEngine(model, pad_id, stop_ids)
    scorer = Scorer(["acc"], [1.0], workers=0)  # held-out greedy accuracy: acc's answer check
    gen = torch.Generator().manual_seed(cfg.seed)
    t0, acc, step = time.time(), {"greedy": 0.0}, 0
    console.print(f"SFT from {cfg.init}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
                  f"batch {cfg.batch_size}, lr {cfg.lr}, until held-out greedy >= {cfg.target_greedy}")
    worked = EPISODES.get(cfg.task)  # a task answered with tools: trained on whole episodes
    if worked is not None:
        return _sft_episodes(cfg, console, model, tokenizer, train, val, worked, eos_id, stop_ids, opt, sched, gen, t0)
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(len(train), (cfg.batch_size,), generator=gen).tolist()
        loss = _train_step(model, opt, sched, *_batch([train[i] for i in idx], tokenizer, eos_id, pad_id))
        if step % cfg.eval_every == 0:
            acc = {"greedy": evaluate(engine, tokenizer, val, scorer, n=0, max_new_tokens=32,
                                       batch_prompts=100)["overall"]["greedy_acc"]}
            console.print(f"sft step {step:>5}  loss {float(loss.detach()):.4f}  held-out greedy {acc['greedy']:.3f}  "
                          f"({time.time() - t0:.0f}s)")
            if cfg.target_greedy > 0 and acc["greedy"] >= cfg.target_greedy:
                break
    _save(cfg, model, tokenizer, stop_ids, val)
    console.print(f"saved to {cfg.out_dir} after {step} steps, held-out greedy {acc['greedy']:.3f}")
    return {"steps": step, "greedy": acc["greedy"], "seconds": time.time() - t0}


def _train_step(model, opt, sched, ids, att, lab) -> torch.Tensor:
    """One optimizer step on a batch (labels -100 where no loss is taken); its loss."""
    model.train()
    loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss


def _save(cfg: SFTConfig, model, tokenizer, stop_ids: list[int], val) -> object:
    """Write the model and check that the tokenizer every later run loads encodes the held-out prompts as
    they were trained on; the reloaded tokenizer."""
    Path(cfg.out_dir).parent.mkdir(parents=True, exist_ok=True)
    save_hf(model, tokenizer, cfg.out_dir, stop_ids)
    reloaded = load_model(cfg.out_dir).tokenizer  # what every later run will see
    for p in val:
        again = reloaded.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        if list(again) != p.ids:
            raise RuntimeError(f"{cfg.out_dir}: the saved tokenizer encodes a prompt differently after "
                               f"reloading ({len(p.ids)} vs {len(again)} tokens); the model would be trained "
                               f"on one tokenization and run on another.")
    return reloaded


def _sft_episodes(cfg: SFTConfig, console, model, tokenizer, train, val, worked, eos_id: int, stop_ids: list[int],
                  opt, sched, gen, t0: float) -> dict:
    """SFT on whole tool episodes (loss on the assistant turns), stopped once greedy held-out episodes with
    the calculator reach ``target_greedy``."""
    tail = [tokenizer.convert_ids_to_tokens(i) for i in stop_ids]
    if "</tool_call>" not in tail:
        raise ConfigError(f"task={cfg.task} is answered with tool calls, but the model's stop tokens ({', '.join(tail)}) "
                          f"do not include </tool_call>: build it with model=tiny-tools, or start from a model "
                          f"whose generation_config.json names </tool_call>'s id in eos_token_id.")
    pad_id = tokenizer.pad_token_id
    renderer = TurnRenderer(tokenizer)
    engine = NativeEngine(model, pad_id, stop_ids)
    traces: dict[int, tuple[list[int], list[int]]] = {}
    score, step = {"tools": 0.0, "no_tools": 0.0, "calls": 0.0}, 0
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(len(train), (cfg.batch_size,), generator=gen).tolist()
        for i in idx:
            if i not in traces:
                traces[i] = episode_trace(train[i], worked(train[i]), tokenizer, renderer, eos_id)
        loss = _train_step(model, opt, sched, *_pad([traces[i] for i in idx], pad_id))
        if step % cfg.eval_every == 0:
            model.eval()
            score = tool_accuracy(engine, tokenizer, val, stop_ids, pad_id)
            console.print(f"sft step {step:>5}  loss {float(loss.detach()):.4f}  held-out greedy with tools "
                          f"{score['tools']:.3f} (calls well formed {score['calls']:.2f}, without tools "
                          f"{score['no_tools']:.3f})  ({time.time() - t0:.0f}s)")
            if cfg.target_greedy > 0 and score["tools"] >= cfg.target_greedy:
                break
    seconds = time.time() - t0
    model.eval()
    direct = direct_accuracy(engine, tokenizer, val)
    reloaded = _save(cfg, model, tokenizer, stop_ids, val)
    for p in val[:8]:  # the episodes every later run builds: the same tokens with the reloaded tokenizer
        if episode_trace(p, worked(p), reloaded, TurnRenderer(reloaded), eos_id) != \
                episode_trace(p, worked(p), tokenizer, renderer, eos_id):
            raise RuntimeError(f"{cfg.out_dir}: the saved tokenizer renders an episode differently after reloading; "
                               f"the model would be trained on one tokenization and run on another.")
    console.print(f"saved to {cfg.out_dir} after {step} steps ({seconds:.0f}s), held-out greedy with tools "
                  f"{score['tools']:.3f}, without tools {score['no_tools']:.3f}, answering at once {direct:.3f}; "
                  f"calls well formed {score['calls']:.2f}")
    return {"steps": step, "greedy": score["tools"], "no_tools": score["no_tools"], "direct": direct,
            "calls": score["calls"], "seconds": seconds}
