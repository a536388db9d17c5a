"""The public primitives of user models (``g3mpi.nn``) equal plain PyTorch on the whole graph, for P = 1..4.

One mpiexec per P runs tests/mpi_nn_api.py's ``Probe``, which calls propagate (sum, mean, gcn; with and without
self loops), attention with dropout, node dropout and the global reductions in one training-mode forward and
backward; its logits and every parameter gradient are compared with tests/nn_reference.py's whole-graph version of
the same model, whole tensors, and the graph handle's degrees with the edges counted.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.mpi_nn_api import CH, EPOCH, HEADS, P_ATT, P_DROP, REDUCES, SEED
from tests.nn_reference import WholeGraph
from tests.pyg_reference import rel_err

SLOW_TESTS = ("test_primitives_equal_whole_graph",)
TOL = 1e-5


def probe_reference(g, state):
    """(logits, loss, {param: grad}) of ``Probe`` on the whole graph ``g``, loaded with ``state``."""
    from g3mpi.nn.primitives import SITE_BASE
    from g3mpi.ops import DropoutKey
    wg = WholeGraph(g.indptr, g.indices)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in state.items()}
    key = DropoutKey(SEED, EPOCH)
    x = torch.from_numpy(g.features)
    h = torch.tanh(F.linear(x, p["lin.weight"], p["lin.bias"]))
    parts = [wg.propagate(h, r, loops) for r, loops in REDUCES]
    z = F.linear(h, p["att_lin.weight"]).view(-1, HEADS, CH)
    a = wg.attention(z, (z * p["att_src"]).sum(-1), (z * p["att_dst"]).sum(-1), P_ATT, key, SITE_BASE)
    stats = torch.cat([h.sum(0) / wg.n, (h * h).mean(0), h.amax(0)])
    feats = torch.cat(parts + [a.reshape(-1, HEADS * CH), stats.expand(wg.n, -1)], dim=1)
    logits = F.linear(wg.dropout(feats, P_DROP, key, SITE_BASE + 1), p["out.weight"], p["out.bias"])
    train = torch.from_numpy(g.train_mask)
    loss = F.cross_entropy(logits[train], torch.from_numpy(g.labels)[train], reduction="sum") / int(train.sum())
    loss.backward()
    return logits.detach().numpy(), float(loss.detach()), {k: v.grad.numpy() for k, v in p.items()}, wg


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_primitives_equal_whole_graph(P, tmp_path):
    g = random_graph(n=90, seed=11, multi=True)    # duplicate edges and self loops in the file
    partition(g, P, tmp_path / "parts")
    run_mpi(P, "tests.mpi_nn_api", tmp_path / "parts", tmp_path / "out.npz")
    res = np.load(tmp_path / "out.npz")
    state = {k[len("init/"):]: res[k] for k in res.files if k.startswith("init/")}
    logits, loss, grads, wg = probe_reference(g, state)
    assert rel_err(res["logits"], logits) <= TOL
    assert abs(float(res["loss"]) - loss) <= TOL * abs(loss)
    assert set(grads) == {k[len("grad/"):] for k in res.files if k.startswith("grad/")}
    for k, v in grads.items():
        assert np.abs(v).sum() > 0, f"reference gradient of {k} is zero (the test would be vacuous)"
        assert rel_err(res[f"grad/{k}"], v) <= TOL, f"P={P}: gradient of {k}"
    assert np.array_equal(res["in_degree"], wg.in_degree.numpy())
    assert np.array_equal(res["out_degree"], wg.out_degree.numpy())
    assert (len(res["halo_ids"]) > 0) == (P > 1)
