"""Supervised warm start on a built-in task: how the shipped tiny model is made.

Loss on the response tokens only (worked answer + stop token). Stops once held-out greedy
accuracy reaches ``target_greedy``, because accuracy rises steeply and a step count alone
lands somewhere different on every machine.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from verirl.config import SFTConfig
from verirl.data import TASKS, encode_prompts, reference_response
from verirl.train.evaluate import evaluate
from verirl.models import load_model, save_hf
from verirl.models.tiny import build_model, build_tokenizer
from verirl.rollout import NativeEngine
from verirl.train.update import build_optimizer
from verirl.rewards import Scorer
from verirl.train.build import seed_everything


def _batch(prompts, tokenizer, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs, labels = [], []
    for p in prompts:
        resp = tokenizer(reference_response(p), add_special_tokens=False)["input_ids"] + [eos_id]
        seqs.append(p.ids + resp)
        labels.append([-100] * len(p.ids) + resp)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    lab = torch.full((len(seqs), width), -100)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)], lab[i, :len(s)], att[i, :len(s)] = torch.tensor(s), torch.tensor(l), 1
    return ids, att, lab


def sft(cfg: SFTConfig, console=None) -> dict:
    from rich.console import Console
    console = console or Console()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    if cfg.init == "scratch":
        tokenizer = build_tokenizer(seed=cfg.seed)
        model = build_model(tokenizer, seed=cfg.seed)
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
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(len(train), (cfg.batch_size,), generator=gen).tolist()
        ids, att, lab = _batch([train[i] for i in idx], tokenizer, eos_id, pad_id)
        model.train()
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.eval_every == 0:
            acc = {"greedy": evaluate(engine, tokenizer, val, scorer, n=0, max_new_tokens=32,
                                       batch_prompts=100)["overall"]["greedy_acc"]}
            console.print(f"sft step {step:>5}  loss {float(loss.detach()):.4f}  held-out greedy {acc['greedy']:.3f}  "
                          f"({time.time() - t0:.0f}s)")
            if cfg.target_greedy > 0 and acc["greedy"] >= cfg.target_greedy:
                break
    Path(cfg.out_dir).parent.mkdir(parents=True, exist_ok=True)
    save_hf(model, tokenizer, cfg.out_dir, stop_ids)
    reloaded = load_model(cfg.out_dir).tokenizer  # what every later run will see
    for p in val:
        again = reloaded.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        if list(again) != p.ids:
            raise RuntimeError(f"{cfg.out_dir}: the saved tokenizer encodes a prompt differently after "
                               f"reloading ({len(p.ids)} vs {len(again)} tokens); the model would be trained "
                               f"on one tokenization and run on another.")
    console.print(f"saved to {cfg.out_dir} after {step} steps, held-out greedy {acc['greedy']:.3f}")
    return {"steps": step, "greedy": acc["greedy"], "seconds": time.time() - t0}
