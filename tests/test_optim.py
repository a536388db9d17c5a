"""g3-train's optimisers (``g3mpi.train.optim``) take torch.optim's steps bit for bit and share its state_dict
layout, so checkpoints move between them; they never import torch's compiler."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from tests.conftest import tool_env

CASES = [("Adam", dict(lr=0.01, weight_decay=5e-4)), ("Adam", dict(lr=0.05)),
         ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=5e-4)), ("SGD", dict(lr=0.1))]


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((7, 5), (5,), (3, 2))]


def _grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        # the last parameter gets no gradient in odd steps (a rank without rows of some layer)
        p.grad = None if (i == 2 and step % 2) else torch.randn(p.shape, generator=g) * 10 ** (i - 1)


@pytest.mark.parametrize("name,kw", CASES)
def test_same_steps_and_state_as_torch(name, kw):
    from g3mpi.train import optim
    ours_p, ref_p = _params(1), _params(1)
    ours, ref = getattr(optim, name)(ours_p, **kw), getattr(torch.optim, name)(ref_p, **kw)
    for step in range(6):
        _grads(ours_p, step)
        _grads(ref_p, step)
        ours.step()
        ref.step()
        for a, b in zip(ours_p, ref_p):
            assert torch.equal(a, b), (name, step)
        ours.zero_grad(set_to_none=False)
        ref.zero_grad(set_to_none=False)
    sd, rsd = ours.state_dict(), ref.state_dict()
    assert sd["param_groups"] == rsd["param_groups"]
    assert sd["state"].keys() == rsd["state"].keys()
    for i in rsd["state"]:
        assert sd["state"][i].keys() == rsd["state"][i].keys()
        assert all(torch.equal(sd["state"][i][k], rsd["state"][i][k]) for k in rsd["state"][i])


@pytest.mark.parametrize("name,kw", CASES)
def test_checkpoints_move_between_them(name, kw):
    """A torch.optim state loaded into ours (and ours into torch.optim) continues with the same steps."""
    from g3mpi.train import optim
    src_p = _params(2)
    src = getattr(torch.optim, name)(src_p, **kw)
    for step in range(3):
        _grads(src_p, step)
        src.step()
    a_p, b_p = [p.detach().clone().requires_grad_() for p in src_p], [p.detach().clone().requires_grad_()
                                                                      for p in src_p]
    a, b = getattr(optim, name)(a_p, **kw), getattr(torch.optim, name)(b_p, **kw)
    a.load_state_dict(copy.deepcopy(src.state_dict()))     # (as from a file: no tensor shared)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for step in range(3, 6):
        _grads(a_p, step)
        _grads(b_p, step)
        a.step()
        b.step()
    assert all(torch.equal(x, y) for x, y in zip(a_p, b_p))


def test_no_compiler_imported():
    code = ("import sys, torch; from g3mpi.train.optim import Adam; p = torch.nn.Parameter(torch.ones(2)); "
            "o = Adam([p], lr=0.1); p.grad = torch.ones(2); o.step(); o.zero_grad(); o.load_state_dict("
            "o.state_dict()); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tool_env(), check=True)
    assert out.stdout.strip() == "False"
