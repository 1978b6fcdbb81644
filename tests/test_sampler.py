"""The prompt order: veRL's (torch RandomSampler with a seeded generator), Megatron-style, resumable."""
import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import RandomSampler

from verirl.data import PromptSampler


@pytest.mark.parametrize("seed,size", [(0, 7), (1, 100), (42, 33), (1234, 5)])
def test_verl_order_equals_torch_random_sampler_across_epochs(seed, size):
    sampler = RandomSampler(range(size), generator=torch.Generator().manual_seed(seed))
    torch_order = list(itertools.chain.from_iterable(list(iter(sampler)) for _ in range(3)))  # 3 epochs
    ours = PromptSampler(size, seed, "verl").take(3 * size)
    assert ours == torch_order


@pytest.mark.parametrize("mode", ["verl", "megatron", "sequential"])
@pytest.mark.parametrize("cut", [3, 10, 17])  # mid-epoch, at the boundary, in the next epoch
def test_resume_mid_epoch_continues_the_same_order(mode, cut):
    full = PromptSampler(10, 5, mode).take(30)
    first = PromptSampler(10, 5, mode)
    head = first.take(cut)
    resumed = PromptSampler(10, 5, mode)
    resumed.load_state_dict(first.state_dict())
    assert head + resumed.take(30 - cut) == full


def test_verl_resume_equals_torch_order():
    size, seed = 12, 0
    sampler = RandomSampler(range(size), generator=torch.Generator().manual_seed(seed))
    torch_order = list(iter(sampler)) + list(iter(sampler))
    s = PromptSampler(size, seed, "verl")
    s.take(15)
    r = PromptSampler(size, seed, "verl")
    r.load_state_dict(s.state_dict())
    assert r.take(9) == torch_order[15:24]


def test_megatron_order_and_every_epoch_is_a_permutation():
    s = PromptSampler(9, 3, "megatron")
    e0, e1 = s.take(9), s.take(9)
    assert e0 == np.random.RandomState(3).permutation(9).tolist()
    assert e1 == np.random.RandomState(4).permutation(9).tolist()
    assert sorted(e0) == sorted(e1) == list(range(9))


def test_bad_state_and_mode_are_refused():
    with pytest.raises(ValueError, match="not a known name"):
        PromptSampler(5, 0, "random")
    with pytest.raises(ValueError, match="seed=1"):
        PromptSampler(5, 0).load_state_dict({"position": 2, "seed": 1, "mode": "verl", "size": 5})
