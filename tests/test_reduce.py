"""Global reductions (g3mpi.ops.reduce) over P ranks equal one process's sum, mean and max: values and the
gradient of every node, whole tensors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.mpi_reduce import loss_of, values

pytestmark = pytest.mark.slow  # every test here starts mpiexec


@pytest.mark.parametrize("P", [1, 2, 4])
def test_global_reductions_equal_one_process(tmp_path, P):
    g = random_graph(n=120)
    partition(g, P, tmp_path / "parts")
    run_mpi(P, "tests.mpi_reduce", tmp_path / "parts", tmp_path / "out.npz", timeout=120)
    got = np.load(tmp_path / "out.npz")
    x = values(np.arange(g.num_nodes)).clone().requires_grad_(True)
    loss, (s, m, mx) = loss_of(x, lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0))
    loss.backward()
    want = np.concatenate([s.detach().numpy(), m.detach().numpy(), mx.detach().numpy()])
    np.testing.assert_allclose(got["vals"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["grad"], x.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert (x.grad[:, 4] != 0).sum() > 1     # the tied maxima share the gradient
