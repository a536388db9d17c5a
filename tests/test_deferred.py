"""Deferred weight gradients (``g3mpi.ops.deferred``): what autograd gives, bit for bit, and one accumulation per
parameter, after which its post-accumulate hooks fire (the gradient allreduce's buckets must see the whole sum)."""
from __future__ import annotations

import torch

from g3mpi.ops.deferred import WeightGrads, deferring, linear


def _run(defer: bool, grad_none: bool = False):
    torch.manual_seed(0)
    x = torch.randn(300, 7, requires_grad=True)
    w, b = torch.nn.Parameter(torch.randn(5, 7)), torch.nn.Parameter(torch.randn(5))
    w.grad = None if grad_none else torch.full_like(w, 0.25)   # a gradient already there is added to
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    q = WeightGrads() if defer else None
    with deferring(q):
        y = torch.cat([linear(x[:100], w, b), linear(x[100:250], w, b), linear(x[250:], w)]).relu()
    (y ** 2).sum().backward()
    return w.grad, b.grad, x.grad, seen


def test_deferred_gradients_equal_autograd_bit_for_bit():
    for grad_none in (False, True):
        ref = _run(False, grad_none=grad_none)
        got = _run(True, grad_none=grad_none)
        for a, c in zip(ref[:3], got[:3]):
            assert torch.equal(a, c)
        # one accumulation, the hook seeing the whole gradient
        assert len(got[3]) == 1 and torch.equal(got[3][0], got[0])


def test_outside_deferring_it_is_f_linear():
    x, w = torch.randn(4, 3, requires_grad=True), torch.nn.Parameter(torch.randn(2, 3))
    y = linear(x, w)
    assert type(y.grad_fn).__name__ == "MmBackward0"
    with torch.no_grad(), deferring(WeightGrads()):
        assert linear(x, w).grad_fn is None


def test_weight_the_only_gradient_is_not_lost():
    # a cached input product (no gradient) through a layer without bias: the weight's is the only gradient
    x, w = torch.randn(6, 3), torch.nn.Parameter(torch.randn(2, 3))
    with deferring(WeightGrads()):
        y = linear(x, w)
    (y ** 2).sum().backward()
    ref = torch.nn.Parameter(w.detach().clone())
    (torch.nn.functional.linear(x, ref) ** 2).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, ref.grad)
