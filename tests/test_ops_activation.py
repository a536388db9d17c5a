"""The hidden ReLU (``g3mpi.ops.activation.relu_``): the same values and gradients as ``F.relu``, and a backward
that writes over its incoming gradient instead of allocating a new [n, F] tensor."""
import functools

import torch
import torch.nn.functional as F

from g3mpi.ops.activation import relu_


def _inputs(seed=0, n=257, f=33):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, f, generator=g)
    a[::7, ::3] = 0.0           # exact zeros: the gradient there is 0, as in F.relu
    w = torch.randn(f, 5, generator=g)
    return a, w


def _grads(act, a, w, transpose=False):
    a = a.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    x = a * 1.0                 # not a leaf: the forward writes over it
    y = act(x)
    z = (y.t().t() @ w) if transpose else (y @ w)
    (z.square().sum()).backward()
    return y.detach(), a.grad, w.grad


class _Record(torch.autograd.Function):
    """Identity whose backward records where its incoming gradient lies (and hands on a copy)."""

    @staticmethod
    def forward(ctx, x, seen):
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.seen["dx"] = g.data_ptr()
        return g.clone(), None


def _masks_in_place(act, a, w) -> bool:
    """Backpropagate ``(act(x) @ w).sum()``; whether the activation's result (the gradient of x) lies where its
    incoming gradient (that of ``act(x)``) was. A tensor hook records the latter without keeping it."""
    seen = {}
    y = act(_Record.apply(a.clone().requires_grad_(True), seen))
    y.register_hook(lambda g: seen.__setitem__("dy", g.data_ptr()))
    (y @ w).sum().backward()
    return seen["dx"] == seen["dy"]


def test_relu_values_and_gradients_equal_torch_relu():
    a, w = _inputs()
    for transpose in (False, True):
        y0, ga0, gw0 = _grads(F.relu, a, w, transpose)
        y1, ga1, gw1 = _grads(relu_, a, w, transpose)
        assert torch.equal(y0, y1)
        assert torch.equal(ga0, ga1)
        assert torch.equal(gw0, gw1)


def test_relu_backward_masks_its_incoming_gradient_in_place():
    a, w = _inputs(1)
    assert _masks_in_place(relu_, a, w)
    assert not _masks_in_place(F.relu, a, w)   # the test tells the two apart


def test_relu_backward_leaves_a_shared_gradient_alone():
    """A gradient that is a view of a larger tensor is masked into a new tensor; the larger tensor keeps its
    values (here the gradient of the other half of a concatenation)."""
    a, w = _inputs(2)
    a = a.clone().requires_grad_(True)
    b = torch.randn(a.shape)
    x = a * 1.0
    y = relu_(x)
    seen = {}
    both = torch.cat([y, b.requires_grad_(True)])
    both.register_hook(lambda g: seen.__setitem__("g", g))
    (both @ w).square().sum().backward()
    g = seen["g"]
    assert torch.equal(a.grad, g[: len(a)] * (y.detach() > 0))
    assert torch.equal(b.grad, g[len(a):])


class _PassThrough(torch.autograd.Function):
    """A backward that hands its incoming gradient on as it is (as ``y + c`` does to both branches)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def test_relu_backward_leaves_a_gradient_another_branch_holds_alone():
    """``(y + c)``'s backward gives y's and c's branches the same tensor; c's branch runs after the ReLU's
    backward (c was made first), so masking that tensor in place would zero parts of c's gradient."""
    a, _ = _inputs(3)
    scale = torch.arange(a.numel(), dtype=torch.float32).view(a.shape)
    for through in (False, True):
        grads = []
        for act in (F.relu, relu_):
            a0 = a.clone().requires_grad_(True)
            c0 = torch.randn(a.shape, generator=torch.Generator().manual_seed(4)).requires_grad_(True)
            c = c0 * 2.0
            y = act(a0 * 1.0)
            ((( _PassThrough.apply(y) if through else y) + c) * scale).sum().backward()
            grads.append((a0.grad, c0.grad))
        assert torch.equal(grads[0][0], grads[1][0])
        assert torch.equal(grads[0][1], grads[1][1])


def test_the_models_hidden_relu_masks_its_gradient_in_place():
    """GCN and SAGE apply ``relu_`` (the forward and the backward in place); GAT keeps F.relu's out-of-place
    forward (its attention backward needs the layer output)."""
    from types import SimpleNamespace

    from g3mpi.nn import GATLayer, GCNLayer, SAGELayer
    from g3mpi.nn.model import GNN
    a, w = _inputs(5)
    for layer, in_place in ((GCNLayer, True), (SAGELayer, True), (GATLayer, False)):
        act = functools.partial(GNN.activation, SimpleNamespace(act=F.relu, convs=[layer]))
        assert _masks_in_place(act, a, w) is in_place, layer.__name__
