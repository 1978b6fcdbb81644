"""The reward services by name (``reward.verifiers``) and how each is built from the reward section
(`verirl.rewards.service` holds the protocol they implement). Each builder imports its module when
called: a run that names no service loads none of them."""
from __future__ import annotations

from typing import Callable, Sequence

from verirl.core.registry import Registry
from verirl.rewards.service import Service, ServiceContext


def _code(reward, ctx: ServiceContext) -> Service:
    from verirl.rewards.code import CodeService
    return CodeService(reward.code, hide=ctx.hide)


def _remote(reward, ctx: ServiceContext) -> Service:
    from verirl.rewards.remote import RemoteService
    return RemoteService(reward.remote)


def _judge(reward, ctx: ServiceContext) -> Service:
    from verirl.rewards.remote import JudgeService
    return JudgeService(reward.judge)


def _model(reward, ctx: ServiceContext) -> Service:
    from verirl.rewards.model import RewardModelService
    return RewardModelService(reward.model, device=ctx.device, dtype=ctx.dtype)


SERVICES: Registry = Registry("reward service", {"code": _code, "remote": _remote, "judge": _judge, "model": _model})


def build_services(verifiers: Sequence[str], reward, ctx: ServiceContext) -> dict[str, Service]:
    """The services ``verifiers`` names, built from the reward section."""
    builders: dict[str, Callable] = {n: SERVICES[n] for n in verifiers if n in SERVICES}
    return {n: build(reward, ctx) for n, build in builders.items()}
