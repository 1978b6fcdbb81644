"""The step's settings: frozen plain values that `verirl.train.build` makes from the config once,
so that the step and the loop read no config."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from verirl.core.types import Prompt
from verirl.models.perf import FlopModel
from verirl.rollout import SamplingParams
from verirl.rollout.sampling import stream_seed
from verirl.train.update import LogprobPass, UpdateParams


@dataclass(frozen=True)
class ActivationSettings:
    """trainer.dump_activations: which steps' updates are recorded, and how (`verirl.train.record`)."""
    steps: frozenset[int]
    modules: str  # a regular expression over module names
    backward: bool
    dir: Path
    meta: dict  # written into each dump: what a comparison must know about the run


@dataclass(frozen=True)
class FilterSettings:
    """algo.filter_groups: DAPO dynamic sampling."""
    metric: str  # reward (the shaped total) or a rule's name
    max_gen_batches: int  # generation batches per step at most; 0 = no limit


@dataclass(frozen=True)
class RewardShaping:
    """What turns the rules' scores into each response's reward."""
    aggregate: str = "sum"  # sum (the scorer's weighted sum) / normalize_then_sum (GDPO)
    overlong: Optional[tuple[int, int, float]] = None  # (max_new_tokens, buffer, penalty factor): DAPO shaping


@dataclass(frozen=True)
class DistillSettings:
    """algo.distill: on-policy distillation from a teacher model."""
    teacher_pass: LogprobPass  # the teacher's log-prob pass (the reference pass's budget)
    coef: float  # weight of the per-token advantage teacher log-prob - student log-prob
    rewards: bool  # add the rules' group advantage (False: the distillation advantage alone)


@dataclass(frozen=True)
class StepSettings:
    """What one GRPO step needs, as plain values."""
    prompts_per_step: int  # the global batch's prompts
    group_size: int  # rollout.n: samples per prompt
    sampling: SamplingParams  # its seed is replaced by the step's own (`sampling_at`)
    seed: int  # trainer.seed
    generate_batch: int  # sequences per generate call; 0 = the whole step at once
    old_pass: Optional[LogprobPass]  # None: on-policy, the update uses its own log-probs, detached
    ref_pass: Optional[LogprobPass]  # None: no KL term, no reference model
    advantages: Callable[..., torch.Tensor]  # (N,) rewards of the GLOBAL batch, lengths= (N,) -> (N,) advantages
    update: UpdateParams  # its mini_batch_prompts are this rank's share
    dump_rollouts: bool  # the step returns one record per response
    activations: Optional[ActivationSettings] = None  # record the update's activations at these steps
    shaping: RewardShaping = RewardShaping()
    filter: Optional[FilterSettings] = None  # None: every generated group is trained on
    flops: Optional[FlopModel] = None  # the model's shape numbers for perf/mfu (`verirl.models.perf`)
    peak_flops: float = 0.0  # one device's peak FLOP/s (trainer.peak_flops, or measured)
    env_reward: str = "sum"  # multi-turn: what the environment's rewards add to the answer's (sum / last)
    separate: bool = False  # rollout.placement=separate: the batches come from producers (`verirl.train.async_source`)
    sync_every: int = 1  # separate: the weights go to the producers every N updates (and after the last)
    distill: Optional[DistillSettings] = None  # algo.distill: the teacher's pass and how its advantage is used
    router_replay: str = ""  # a MoE model's algo.router_replay (off / r2 / r3); "": dense, no router tap
    moe_aux_loss_coef: float = 0.0  # a MoE model's algo.moe_aux_loss_coef

    def positions(self, rank: int, world: int) -> list[int]:
        """The positions in the step's global batch of ``rank``'s prompts: its part of every global
        mini-batch (whole groups), so its k-th mini-batch is its share of the global k-th one and N
        ranks take the one-rank update mini-batch by mini-batch."""
        mine = self.update.mini_batch_prompts  # this rank's part of each global mini-batch
        every = mine * world
        return [k * every + rank * mine + j for k in range(self.prompts_per_step // every) for j in range(mine)]

    def sampling_at(self, step: int, gen_batch: int = 0) -> SamplingParams:
        """The rollout's sampling parameters at ``step``: a seed of its own, so a resumed run samples
        the same responses. A step's further generation batches (algo.filter_groups) are keyed by their
        number too: (seed, step, generation batch, prompt position) picks every uniform."""
        seed = self.seed * 1_000_003 + step
        if gen_batch:
            seed = stream_seed(seed, gen_batch)
        return dataclasses.replace(self.sampling, seed=seed, step=step)

    def fewer_groups(self, groups: int, world: int) -> "StepSettings":
        """These settings for a step that trains on ``groups`` prompt groups (``groups`` a multiple of
        the ranks' count): whole mini-batches of the configured size when there are enough, else one
        mini-batch of them all (so an on-policy run stays on-policy)."""
        mini = self.update.mini_batch_prompts * world
        per_rank = self.update.mini_batch_prompts if groups >= mini else groups // world
        return dataclasses.replace(self, prompts_per_step=groups,
                                   update=dataclasses.replace(self.update, mini_batch_prompts=per_rank))

    def trainable(self, informative: int, world: int) -> int:
        """How many of ``informative`` groups a step can train on: a whole number of the configured
        mini-batches, else a multiple of the ranks' count (at least one group per rank)."""
        mini = self.update.mini_batch_prompts * world
        unit = mini if informative >= mini else world
        return min(self.prompts_per_step, max(informative // unit * unit, world))


@dataclass(frozen=True)
class EvalSettings:
    """Held-out evaluation during a run (`verirl.train.evaluate.evaluate`'s arguments and when to call it)."""
    prompts: list[Prompt]
    n: int
    temperature: float
    greedy: bool
    max_new_tokens: int
    seed: int
    before_train: bool
    every: int
    at_end: bool
    top_p: float = 1.0
    top_k: int = 0

    def due(self, step: int, last: int) -> bool:
        """Whether to evaluate after ``step``: every ``every`` steps, and after the last one."""
        if not self.prompts:
            return False
        return bool(self.every and step % self.every == 0) or (step == last and (self.at_end or bool(self.every)))


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW's settings, put back into a restored optimizer (a resume may change them)."""
    lr: float
    betas: tuple[float, float]
    weight_decay: float

