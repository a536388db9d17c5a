"""Typed message passing (``gnn.Propagate(..., relations=True)``): sum and R-GCN's mean against a dense
per-relation computation, forward and backward; bad shapes and reductions refused; typed R-MAT graphs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi4py import MPI

from g3mpi import nn as gnn
from g3mpi.comm import CommContext
from g3mpi.format import read_meta, read_part
from g3mpi.ops import DistGraph
from tests.graphs import partition, typed_graph
from tests.pyg_reference import rel_err


@pytest.fixture(scope="module")
def typed_part(tmp_path_factory):
    g = typed_graph(n=60, seed=5)
    out = tmp_path_factory.mktemp("typed") / "parts"
    partition(g, 1, out)
    part = read_part(out, 0, read_meta(out))
    ctx = CommContext(MPI.COMM_SELF)
    yield g, part, DistGraph(part, ctx)
    ctx.free()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_typed_propagate(typed_part, reduce):
    """out_i = sum_r sum_{j in N_r(i)} x_{j,r} (/ c_{i,r}): a dense [R, n, n] count of each relation's edges
    (duplicates counted, self loops left out), in the partition's row order; and the gradient is its transpose."""
    g, part, graph = typed_part
    R, n = g.num_relations, g.num_nodes
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    src = np.asarray(g.indices, np.int64)
    a = np.zeros((R, n, n))
    keep = src != dst
    np.add.at(a, (g.edge_type[keep], dst[keep], src[keep]), 1.0)
    if reduce == "mean":
        a /= np.maximum(a.sum(2, keepdims=True), 1)
    perm = part.orig_ids        # row k of the part is original node perm[k] (one part: no halo)
    a = a[:, perm][:, :, perm]
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((n, R, 5)), dtype=torch.float32, requires_grad=True)
    prop = gnn.Propagate(graph, reduce, relations=True)
    out = prop(x)
    want = np.einsum("rij,jrf->if", a, x.detach().numpy().astype(np.float64))
    assert out.shape == (n, 5) and rel_err(out.detach().numpy(), want) <= 1e-6
    gout = torch.tensor(rng.standard_normal((n, 5)), dtype=torch.float32)
    out.backward(gout)
    assert rel_err(x.grad.numpy(), np.einsum("rij,if->jrf", a, gout.numpy().astype(np.float64))) <= 1e-6


def test_typed_propagate_refuses_other_shapes(typed_part):
    g, part, graph = typed_part
    with pytest.raises(ValueError, match=r"expected \[60, 4, \.\.\.\] rows"):
        gnn.Propagate(graph, "mean", relations=True)(torch.zeros(60, 3, 2))
    with pytest.raises(ValueError, match="per relation: expected one of sum, mean"):
        gnn.Propagate(graph, "gcn", relations=True)


def test_rmat_relations(tmp_path):
    """``g3-prepare rmat --relations R``: the same edges as the untyped graph, each of a relation in [0, R),
    every relation used, rows sorted by source then relation."""
    from data_tools.prepare import main
    from g3mpi.format import load_graph
    for name, extra in (("typed.h5", ["--relations", "3"]), ("plain.h5", [])):
        assert main(["rmat", "--scale", "7", "--quiet", "--out", str(tmp_path / name), *extra]) == 0
    typed, plain = load_graph(tmp_path / "typed.h5"), load_graph(tmp_path / "plain.h5")
    assert typed.num_relations == 3 and plain.num_relations == 0 and plain.edge_type is None
    assert np.array_equal(typed.indptr, plain.indptr) and np.array_equal(typed.indices, plain.indices)
    assert set(np.unique(typed.edge_type)) == {0, 1, 2}
    dst = np.repeat(np.arange(typed.num_nodes), np.diff(typed.indptr))
    key = (dst.astype(np.int64) * typed.num_nodes + typed.indices) * 3 + typed.edge_type
    assert np.all(np.diff(key) >= 0)
