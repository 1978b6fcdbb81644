"""Multi-turn rollouts (`verirl.rollout.multiturn`): the episode is one token sequence, the sampled tokens
as sampled and each observation rendered by the chat template, the loss mask 0 exactly on what was not
sampled; episodes do not depend on their batch; the limits end episodes; the update trains on the
sampled tokens only."""
import copy
from dataclasses import dataclass, field

import pytest
import torch

from verirl.core.algo import aggregate, kl_penalty, policy_loss
from verirl.core.types import TrainBatch
from verirl.data.prompts import encode_prompts
from verirl.data.tasks import arith_split
from verirl.rollout.base import SamplingParams
from verirl.rollout.multiturn import MultiTurn, TurnLimits
from verirl.rollout.native import NativeEngine
from verirl.rollout.render import TurnRenderer, render


@dataclass
class Step:
    observation: object
    reward: object = None
    done: bool = False
    counts: dict = field(default_factory=dict)


class Counter:
    """A user's environment: answers each turn with its length, ends after ``turns`` observations,
    rewards 0.25 per observation."""

    def __init__(self, turns: int = 2):
        self.turns, self.seen = turns, 0

    def reset(self, prompt):
        return None

    def step(self, turn: str):
        self.seen += 1
        if self.seen > self.turns:
            return Step(None, 1.0, True)
        return Step([{"role": "tool", "content": f"turn {self.seen}: {len(turn)} characters"}], 0.25, False,
                    {"tool_calls": 1})

    def close(self):
        pass


LIMITS = TurnLimits(max_turns=4, max_env_turns=4, max_total_tokens=160, max_tokens_per_turn=40,
                    max_observation_tokens=32)


@pytest.fixture(scope="module")
def prompts(tiny):
    train, _ = arith_split(0, 6, 0)
    return encode_prompts(train, tiny.tokenizer, 128)


def _loop(tiny, env=Counter, limits=LIMITS):
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    return MultiTurn(engine, tiny.tokenizer, TurnRenderer(tiny.tokenizer), env, limits, tiny.stop_ids, tiny.pad_id)


SAMPLING = SamplingParams(max_new_tokens=40, temperature=1.0, seed=11)


def test_the_episode_is_the_sampled_tokens_and_the_rendered_observations(tiny, prompts):
    out = _loop(tiny).generate(prompts[:3], 2, SAMPLING, positions=[0, 1, 2])
    r, tok = out.rollout, tiny.tokenizer
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    for i, e in enumerate(out.episodes):
        assert e.turns >= 2 and [role for role, _ in e.segments][:3] == ["assistant", "observation", "assistant"]
        k = len(e.tokens)
        assert r.response_ids[i, :k].tolist() == e.tokens and r.response_mask[i].sum() == k
        assert r.loss_mask[i, :k].tolist() == e.mask
        at, history, seen = 0, list(e.prompt.messages), 0
        for role, length in e.segments:
            span = e.tokens[at:at + length]
            if role == "assistant":
                assert set(e.mask[at:at + length]) == {1}
                # the engine samples these very tokens from the prefix, keyed by the response position
                again = engine.generate([e.prompt_ids + e.tokens[:at]], 1, SAMPLING, prompt_index=[e.position],
                                        sample_index=[e.sample], offset=[at])
                assert again.response_ids[0, :length].tolist() == span
                text = tok.decode(span, skip_special_tokens=True)
            else:
                assert set(e.mask[at:at + length]) == {0}
                # the observation and the next header, as the template writes them after the turn
                seen += 1
                obs = {"role": "tool", "content": f"turn {seen}: {len(text)} characters"}
                whole = render(tok, [*history, {"role": "assistant", "content": text}, obs])
                before = render(tok, [*history, {"role": "assistant", "content": text}], generation_prompt=False)
                assert before.endswith("<|im_end|>\n") and tok.decode(span) == "\n" + whole[len(before):]
                history += [{"role": "assistant", "content": text}, obs]
            at += length
        assert e.rewards[:2] == [0.25, 0.25]
    # the whole conversation rendered again gives the same tokens here (this template keeps every turn)
    full = [e for e in out.episodes if e.tokens[-1] in tiny.stop_ids and len(e.segments) == 5]
    assert full
    for e in full:
        final = tok.decode(e.tokens[sum(n for _, n in e.segments[:4]):], skip_special_tokens=True)
        msgs = [*e.messages, {"role": "assistant", "content": final}]
        assert tok(render(tok, msgs, generation_prompt=False).rstrip("\n"), add_special_tokens=False)["input_ids"] == \
            e.prompt_ids + e.tokens


def test_an_episode_does_not_depend_on_its_batch(tiny, prompts):
    loop = _loop(tiny)
    together = loop.generate(prompts[:4], 2, SAMPLING, positions=[0, 1, 2, 3])
    alone = loop.generate(prompts[2:3], 2, SAMPLING, positions=[2])
    assert [e.tokens for e in alone.episodes] == [e.tokens for e in together.episodes[4:6]]
    assert [e.mask for e in alone.episodes] == [e.mask for e in together.episodes[4:6]]
    again = loop.generate(prompts[:4], 2, SAMPLING, positions=[0, 1, 2, 3])
    assert [e.tokens for e in again.episodes] == [e.tokens for e in together.episodes]


def test_the_limits_end_episodes(tiny, prompts):
    two = _loop(tiny, lambda: Counter(turns=10), TurnLimits(2, 10, 160, 40, 32)).generate(prompts[:2], 2, SAMPLING)
    assert all(e.turns <= 2 and e.env_turns <= 1 for e in two.episodes)
    assert all(e.segments[-1][0] == "assistant" for e in two.episodes)  # no observation after the last turn
    short = _loop(tiny, lambda: Counter(turns=10), TurnLimits(10, 10, 60, 40, 32)).generate(prompts[:2], 2, SAMPLING)
    assert all(len(e.tokens) <= 60 for e in short.episodes)
    assert short.rollout.response_ids.shape[1] <= 60
    cut = _loop(tiny, lambda: Counter(turns=10), TurnLimits(10, 10, 160, 3, 32)).generate(prompts[:2], 2, SAMPLING)
    assert all(e.turns == 1 and len(e.tokens) == 3 and not e.stopped for e in cut.episodes)  # cut: no tool ran
    long_obs = _loop(tiny, lambda: Counter(turns=10), TurnLimits(3, 3, 160, 40, 2)).generate(prompts[:1], 1, SAMPLING)
    e = long_obs.episodes[0]
    assert "...(cut)" in tiny.tokenizer.decode(e.tokens)


def test_the_environments_rewards_sum_or_last(tiny, prompts):
    out = _loop(tiny).generate(prompts[:2], 2, SAMPLING)
    for e, s, last in zip(out.episodes, out.env_rewards("sum"), out.env_rewards("last")):
        assert s == pytest.approx(sum(e.rewards)) and last == e.rewards[-1]


class Greeter(Counter):
    """A first observation from reset(prompt) (a task the environment states), then `Counter`'s turns."""

    def reset(self, prompt):
        return [{"role": "user", "content": "first: answer in one turn"}]


def test_a_first_observation_from_reset_goes_into_the_prompt_not_the_trained_tokens(tiny, prompts):
    out = _loop(tiny, lambda: Greeter(turns=1)).generate(prompts[:2], 1, SAMPLING, positions=[0, 1])
    r, renderer = out.rollout, TurnRenderer(tiny.tokenizer)
    for i, (p, e) in enumerate(zip(prompts[:2], out.episodes)):
        first = {"role": "user", "content": "first: answer in one turn"}
        assert e.messages[:len(p.messages) + 1] == [*p.messages, first]
        assert e.prompt_ids == renderer.prompt_ids([*p.messages, first])
        assert "first: answer in one turn" in tiny.tokenizer.decode(e.prompt_ids) and len(e.prompt_ids) > len(p.ids)
        assert r.prompt_ids[i][r.prompt_mask[i].bool()].tolist() == e.prompt_ids  # the model reads it ...
        assert "first: answer in one turn" not in tiny.tokenizer.decode(e.tokens)  # ... and is not trained on it
        assert e.segments[0][0] == "assistant" and r.loss_mask[i, :e.segments[0][1]].tolist() == [1] * e.segments[0][1]
        assert e.rewards[0] == 0.25  # the loop then ran as without a first observation


def test_masked_positions_contribute_nothing_to_the_loss_kl_or_entropy():
    """A two-turn episode of 6 response tokens: turn 1 (2 tokens), an observation (2, loss mask 0), turn 2
    (2 tokens). Hand-computed: vanilla policy loss, on-policy ratio 1, advantage 0.5 -> each trained token
    -0.5; token-mean over the 4 trained tokens = -0.5 whatever the observation's log-probs are."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    logp = torch.tensor([[-1.0, -2.0, 50.0, -80.0, -0.5, -1.5]])
    old = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -0.5, -1.5]])  # the observation's "old" log-probs differ wildly
    pg, _ = policy_loss("vanilla", logp, old, torch.tensor([0.5]), mask)
    assert float(aggregate(pg, mask)) == pytest.approx(-0.5)
    ref = torch.tensor([[-1.5, -2.0, 0.0, 0.0, -0.5, -1.0]])
    # k3 = exp(ref - logp) - (ref - logp) - 1 on the trained tokens: (e^-0.5 + 0.5 - 1) + 0 + 0 + (e^0.5 - 0.5 - 1)
    k3 = (torch.exp(torch.tensor(-0.5)) - 0.5) + (torch.exp(torch.tensor(0.5)) - 1.5)
    assert float(aggregate(kl_penalty(logp, ref, "low_var_kl"), mask)) == pytest.approx(float(k3) / 4, rel=1e-6)
    ent = torch.tensor([[1.0, 2.0, 100.0, 100.0, 3.0, 4.0]])
    assert float(aggregate(ent, mask)) == pytest.approx(2.5)


def test_the_update_takes_its_statistics_over_the_sampled_tokens_only(tiny, prompts):
    """The trainer's entropy and KL of a real multi-turn rollout equal those computed by hand from a plain
    forward of the whole sequence, averaged over the loss mask (the observations left out)."""
    from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, update_policy

    model = copy.deepcopy(tiny.model)
    ref = copy.deepcopy(tiny.model).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    engine = NativeEngine(model, tiny.pad_id, tiny.stop_ids)
    loop = MultiTurn(engine, tiny.tokenizer, TurnRenderer(tiny.tokenizer), Counter, LIMITS, tiny.stop_ids, tiny.pad_id)
    r = loop.generate(prompts[:2], 2, SAMPLING).rollout
    assert (r.loss_mask < r.response_mask).any()  # observations are there
    P = r.prompt_ids.shape[1]
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    attn = torch.cat([r.prompt_mask, r.response_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1].float(), -1)
        lr = torch.log_softmax(ref(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1].float(), -1)
    tok = r.response_ids[..., None]
    logp, ref_logp = lp.gather(-1, tok)[..., 0], lr.gather(-1, tok)[..., 0]
    ent = -(lp.exp() * lp).sum(-1)
    m = r.loss_mask.float()
    want_ent = float((ent * m).sum() / m.sum())
    want_kl = float((kl_penalty(logp, ref_logp, "low_var_kl") * m).sum() / m.sum())
    optimizer, scheduler = build_optimizer(model, 1e-6, (0.9, 0.999), 0.0, 0)
    p = UpdateParams(group_size=2, mini_batch_prompts=2, forward=LogprobPass(micro_batch_size=4), kl_coef=0.1)
    stats = update_policy(model, optimizer, scheduler, TrainBatch(r, torch.tensor([0.5, -0.5, 1.0, -1.0]), None,
                                                                   ref_logp), p)
    assert stats["actor/entropy"] == pytest.approx(want_ent, rel=1e-4)
    assert stats["actor/kl"] == pytest.approx(want_kl, rel=1e-4, abs=1e-7)
    whole = float((ent * r.response_mask).sum() / r.response_mask.sum())
    assert abs(whole - want_ent) > 1e-3  # the observations would have changed it


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_kept_kv_cache_gives_the_episode_a_fresh_prefill_gives(tiny, prompts, temperature):
    """The native engine keeps each episode's cache across turns and prefills only the observations; the
    same episodes with every turn's whole prefix prefilled again are the same, token for token."""
    sampling = SamplingParams(max_new_tokens=40, temperature=temperature, seed=5)
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    kept = MultiTurn(engine, tiny.tokenizer, TurnRenderer(tiny.tokenizer), Counter, LIMITS, tiny.stop_ids,
                     tiny.pad_id)
    fresh = MultiTurn(engine, tiny.tokenizer, TurnRenderer(tiny.tokenizer), Counter, LIMITS, tiny.stop_ids,
                      tiny.pad_id, continued=False)
    a, b = kept.generate(prompts, 4, sampling), fresh.generate(prompts, 4, sampling)
    assert 0 < kept.last_prefilled < fresh.last_prefilled / 2
    assert sum(e.turns for e in a.episodes) > len(a.episodes)  # later turns were decoded from the kept cache
    assert [e.tokens for e in a.episodes] == [e.tokens for e in b.episodes]
    assert [e.mask for e in a.episodes] == [e.mask for e in b.episodes]
    if temperature > 0:
        torch.testing.assert_close(a.rollout.sample_logprobs, b.rollout.sample_logprobs, atol=1e-4, rtol=0)


class Uneven:
    """Long observations for the first episode of each call, short ones for the others: the episodes' budgets
    left for a turn grow apart."""
    made = 0

    def __init__(self):
        self.long, Uneven.made = Uneven.made % 2 == 0, Uneven.made + 1

    def reset(self, prompt):
        return None

    def step(self, turn):
        text = " ".join(["word"] * 120) if self.long else "ok"
        return Step([{"role": "tool", "content": text}], None, False)

    def close(self):
        pass


def test_episodes_far_apart_in_length_stay_within_their_budgets(tiny, prompts):
    """One episode near max_total_tokens and one far from it decode a turn together: the long one stops at
    its own budget (no position past the cache's rotary table), and each matches a fresh prefill."""
    limits = TurnLimits(max_turns=6, max_env_turns=6, max_total_tokens=300, max_tokens_per_turn=280,
                        max_observation_tokens=140)
    sampling = SamplingParams(max_new_tokens=300, temperature=1.0, seed=3)
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    runs = []
    for continued in (True, False):
        Uneven.made = 0
        loop = MultiTurn(engine, tiny.tokenizer, TurnRenderer(tiny.tokenizer), Uneven, limits, tiny.stop_ids,
                         tiny.pad_id, continued=continued)
        runs.append(loop.generate(prompts[:2], 2, sampling))
    kept, fresh = runs
    assert all(len(e.tokens) <= 300 for e in kept.episodes)
    assert max(len(e.tokens) for e in kept.episodes) > 250 and min(len(e.tokens) for e in kept.episodes) < 150
    assert [e.tokens for e in kept.episodes] == [e.tokens for e in fresh.episodes]
