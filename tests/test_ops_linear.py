"""verirl.core.ops.linear: float32 CPU products through oneDNN equal F.linear's, values and gradients."""
import copy

import pytest
import torch
import torch.nn.functional as F

from verirl.core.ops import linear as L
from verirl.core.ops.head_logprobs import head_logprobs

pytestmark = pytest.mark.skipif(not L.onednn_available(), reason="this torch has no oneDNN")


def _close(a, b, rel=1e-5):
    scale = b.abs().max().clamp(min=1.0)
    assert (a - b).abs().max() <= rel * scale, (a - b).abs().max()


def test_linear_matches_f_linear_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 300, 128, generator=g, requires_grad=True)  # 1,200 rows x 128 x 256: above MIN_MACS
    w = torch.randn(256, 128, generator=g, requires_grad=True)
    b = torch.randn(256, generator=g, requires_grad=True)
    assert x.numel() * w.shape[0] >= L.MIN_MACS
    gy = torch.randn(4, 300, 256, generator=g)
    y = L.linear(x, w, b)
    assert y.grad_fn is not None and type(y.grad_fn).__name__.startswith("_Linear")  # the oneDNN path ran
    grads = torch.autograd.grad(y, (x, w, b), gy)
    y_ref = F.linear(x, w, b)
    grads_ref = torch.autograd.grad(y_ref, (x, w, b), gy)
    _close(y, y_ref)
    for a, r in zip(grads, grads_ref):
        _close(a, r)


def test_small_products_and_other_dtypes_stay_with_f_linear():
    x, w = torch.randn(2, 8, requires_grad=True), torch.randn(4, 8)
    assert type(L.linear(x, w).grad_fn).__name__ != "_LinearBackward"
    xd, wd = torch.randn(2000, 128, dtype=torch.float64), torch.randn(256, 128, dtype=torch.float64)
    assert torch.equal(L.linear(xd, wd), F.linear(xd, wd))


def test_packed_linear_matches_and_does_not_see_later_writes():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1024, 512, generator=g)  # 2^19 entries: laid out by oneDNN
    b = torch.randn(1024, generator=g)
    p = L.PackedLinear(w, b)
    assert p.packed is not None
    x = torch.randn(64, 512, generator=g)
    _close(p(x), F.linear(x, w, b))
    small = torch.randn(3, 512, generator=g)  # below MIN_MACS: F.linear on the original weight
    assert torch.equal(p(small), F.linear(small, w, b))
    before = p(x)
    w.add_(1.0)
    assert torch.equal(p(x), before)  # a snapshot: re-packed by whoever changes the weight


def test_fast_linears_keep_the_model_and_its_outputs():
    from verirl.models.load import load_model

    lm = load_model("tiny")
    n = sum(type(m) is L.FastLinear for m in lm.model.modules())
    assert n == sum(isinstance(m, torch.nn.Linear) for m in lm.model.modules()) > 0
    plain = copy.deepcopy(lm.model)
    for m in plain.modules():
        if type(m) is L.FastLinear:
            m.__class__ = torch.nn.Linear
    assert lm.model.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(3, lm.model.config.vocab_size, (8, 200))  # 1,600 rows: the oneDNN path
    out = lm.model(ids).logits
    ref = plain(ids).logits
    _close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for (name, a), (_, r) in zip(lm.model.named_parameters(), plain.named_parameters()):
        _close(a.grad, r.grad, rel=1e-4)
    twin = copy.deepcopy(lm.model)  # the reference model is a deep copy
    assert type(twin.model.layers[0].mlp.down_proj) is L.FastLinear


def test_head_logprobs_through_a_packed_head_match_the_full_logits():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(200, 64, generator=g, requires_grad=True)  # chunks of 64 x 6,000 x 64: oneDNN
    weight = (torch.randn(6000, 64, generator=g) * 0.1).requires_grad_()  # 384k entries: packed
    labels = torch.randint(0, 6000, (200,), generator=g)
    logp, ent = head_logprobs(hidden, weight, labels, chunk=64, with_entropy=True)
    z = F.linear(hidden, weight).log_softmax(-1)
    ref = z.gather(-1, labels[:, None]).squeeze(-1)
    ref_ent = -(z.exp() * z).sum(-1)
    _close(logp, ref)
    _close(ent, ref_ent)
    gh, gw = torch.autograd.grad((logp + ent).sum(), (hidden, weight))
    rh, rw = torch.autograd.grad((ref + ref_ent).sum(), (hidden, weight))
    _close(gh, rh, rel=1e-4)
    _close(gw, rw, rel=1e-4)
