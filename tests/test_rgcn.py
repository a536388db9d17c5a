"""R-GCN: distributed forward + backward equals single-process PyG ``RGCNConv`` (and ``FastRGCNConv``), no
decomposition, basis and block-diagonal, for P = 1..4 and every schedule; a graph without edge types refused."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from mpi4py import MPI

from g3mpi.comm import CommContext
from g3mpi.format import read_meta, read_part
from g3mpi.ops import DistGraph
from tests.conftest import run_module, run_mpi
from tests.graphs import partition, random_graph, typed_graph
from tests.mpi_exact import HIDDEN
from tests.mpi_exact import RGCN as SETTINGS
from tests.pyg_reference import edge_index_of, rel_err

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_rgcn_equals_pyg", "test_fast_rgcn_is_the_same_operator", "test_g3_train_rgcn")

TOL = 1e-5
needs_pyg = pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric missing")


def pyg_inputs(g):
    """(edge_index, edge_type) of the graph without its self loops (which the partition leaves out)."""
    ei = edge_index_of(g.indptr, g.indices)
    keep = ei[0] != ei[1]
    return ei[:, keep], torch.from_numpy(g.edge_type.astype(np.int64))[keep]


def check_rgcn(res, g, prefix, model, fast=False):
    from tests.pyg_reference import rgcn_reference
    state = {k[len(f"{prefix}/init/"):]: res[k] for k in res.files if k.startswith(f"{prefix}/init/")}
    ei, et = pyg_inputs(g)
    kw = SETTINGS[model]
    lg, loss, grads = rgcn_reference(state, g.features, ei, et, g.labels, g.train_mask, in_dim=g.features.shape[1],
                                     hidden=HIDDEN, out_dim=int(g.attrs["num_classes"]), layers=3,
                                     num_relations=g.num_relations, fast=fast, **kw)
    assert rel_err(res[f"{prefix}/logits"], lg) <= TOL, prefix
    assert abs(float(res[f"{prefix}/loss"]) - loss) <= TOL * abs(loss)
    ours = {k[len(f"{prefix}/grad/"):].replace("root_weight", "root"): res[k] for k in res.files
            if k.startswith(f"{prefix}/grad/")}
    assert set(grads) == set(ours)
    for k, v in grads.items():
        assert np.abs(v).sum() > 0, f"{model}: reference gradient of {k} is zero (test would be vacuous)"
        assert rel_err(ours[k], v) <= TOL, f"{prefix}: gradient of {k}"


@needs_pyg
@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_rgcn_equals_pyg(P, tmp_path):
    """Duplicate edges of different relations, self loops (left out), a relation without edges, isolated nodes;
    pipelined (automatic and 7-row chunks, messages in pieces, random arrival orders) and blocking."""
    g = typed_graph()
    partition(g, P, tmp_path / "parts")
    variants = ["pipelined:0:0", "blocking:0:0", "pipelined:7:0.002:piece64", "pipelined:0:0:remat"]
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(SETTINGS),
            "--variants", ",".join(variants))
    res = np.load(tmp_path / "out.npz")
    for v in variants:
        for model in SETTINGS:
            check_rgcn(res, g, f"{v}/{model}", model)


@needs_pyg
def test_fast_rgcn_is_the_same_operator(tmp_path):
    """FastRGCNConv (per-edge weights, the mean normalised per relation) gives the same logits and gradients."""
    g = typed_graph(seed=3)
    partition(g, 2, tmp_path / "parts")
    run_mpi(2, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(SETTINGS))
    res = np.load(tmp_path / "out.npz")
    for model in SETTINGS:
        check_rgcn(res, g, f"pipelined:0:0/{model}", model, fast=True)


def test_rgcn_refuses_an_untyped_graph(tmp_path):
    from g3mpi.nn.rgcn import RGCNLayer
    partition(random_graph(n=30), 1, tmp_path / "parts")
    part = read_part(tmp_path / "parts", 0, read_meta(tmp_path / "parts"))
    ctx = CommContext(MPI.COMM_SELF)
    try:
        with pytest.raises(ValueError, match="R-GCN needs a graph with edge types"):
            RGCNLayer(DistGraph(part, ctx), 6, 4)
    finally:
        ctx.free()


def test_g3_train_rgcn(tmp_path):
    """``g3-train --model rgcn --num-blocks 2`` trains on a typed partition (the loss falls); on one without edge
    types it stops with one line naming the partition, exit status 1, and no run directory."""
    g = typed_graph(n=80, seed=2)
    partition(g, 2, tmp_path / "typed")
    run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "typed", "--out", tmp_path / "run", "--model", "rgcn",
            "--num-blocks", "2", "--epochs", "12", "--lr", "0.05", "--no-progress")
    import json
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line]
    assert len(losses) == 12 and losses[-1] < losses[0]
    partition(random_graph(n=40), 1, tmp_path / "plain")
    p = run_module("g3mpi.cli.train", "--parts", tmp_path / "plain", "--out", tmp_path / "bad", "--model", "rgcn",
                   "--no-progress", check=False)
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert p.returncode == 1 and len(lines) == 1 and "needs edge types" in lines[0] and "plain" in lines[0]
    assert not (tmp_path / "bad").exists()
