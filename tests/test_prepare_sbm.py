"""The default sbm graph is learnable from structure: a GCN (PyTorch Geometric) clearly beats an MLP on it."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_module
from g3mpi.format import load_graph

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)

torch = pytest.importorskip("torch")


def train_eval(model, forward, x, y, train, test, epochs=100):
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(x)[train], y[train]).backward()
        opt.step()
    with torch.no_grad():
        return (forward(x).argmax(1)[test] == y[test]).float().mean().item()


def test_gcn_beats_mlp_on_default_sbm(tmp_path):
    pyg_nn = pytest.importorskip("torch_geometric.nn")  # here: importing PyG at collection costs seconds
    out = tmp_path / "sbm.h5"
    # only the size is changed from the defaults (homophily 0.7, average degree 10, noise 0.5)
    run_module("data_tools.prepare", "sbm", "--nodes", 3000, "--classes", 10, "--feature-dim", 32, "--out", out,
               "--quiet")
    g = load_graph(out)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    ei = torch.from_numpy(np.stack([g.indices.astype(np.int64), dst]))
    x, y = torch.from_numpy(g.features), torch.from_numpy(g.labels)
    train, test = torch.from_numpy(g.train_mask), torch.from_numpy(g.test_mask)
    c, h = int(g.attrs["num_classes"]), 64

    conv1, conv2 = pyg_nn.GCNConv(x.shape[1], h), pyg_nn.GCNConv(h, c)
    gcn = torch.nn.ModuleList([conv1, conv2])
    acc_gcn = train_eval(gcn, lambda z: conv2(torch.relu(conv1(z, ei)), ei), x, y, train, test)
    mlp = torch.nn.Sequential(torch.nn.Linear(x.shape[1], h), torch.nn.ReLU(), torch.nn.Linear(h, c))
    acc_mlp = train_eval(mlp, mlp, x, y, train, test)
    assert acc_gcn > 0.9, (acc_gcn, acc_mlp)
    assert acc_gcn > acc_mlp + 0.25, (acc_gcn, acc_mlp)
    assert acc_mlp > 1.5 / c, (acc_gcn, acc_mlp)         # features carry signal too, just noisy
