"""eval_mode: eval for the block, the previous training flag afterwards, also after an exception."""
import pytest
import torch

from verirl.models import eval_mode


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_flag(training):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    model.train(training)
    with eval_mode(model) as m:
        assert m is model and not model.training and not model[1].training
    assert model.training is training and model[1].training is training


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_flag_after_an_exception(training):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    model.train(training)
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(model):
            assert not model.training
            raise RuntimeError("boom")
    assert model.training is training and model[1].training is training
