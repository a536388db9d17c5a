"""Learned node embeddings (``gnn.NodeEmbedding``, ``g3-train --node-embedding``): a table sharded by owner, whose
rows, Adam moments and the replicated parameters after 5 training steps at P = 1..4 equal one plain-PyTorch
process training the whole table (tests/mpi_embed.py runs the trainer itself: the gradient allreduce leaves the
table out, the optimiser steps its owned rows), compared whole by original node ID."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from g3mpi.nn.embedding import embedding_init
from g3mpi.ops import DropoutKey
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.mpi_embed import DIM, LR, SEED
from tests.nn_reference import WholeGraph
from tests.pyg_reference import rel_err

SLOW_TESTS = ("test_embeddings_equal_one_process", "test_train_without_features", "test_resume_and_embeddings_h5")
TOL = 1e-5
STEPS, DROPOUT, WEIGHT_DECAY = 5, 0.5, 5e-4


def reference(g, init: dict, emb0: np.ndarray, steps: int):
    """The table, its Adam moments and the other parameters after ``steps`` steps of one process on the whole
    graph ``g``: GCN (PyG GCNConv) x2 on [embedding | features], dropout keyed as the built-in stack's."""
    wg = WholeGraph(g.indptr, g.indices)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    emb = torch.tensor(emb0, requires_grad=True)
    opt = torch.optim.Adam([emb, *p.values()], lr=LR, weight_decay=WEIGHT_DECAY)
    y, train = torch.from_numpy(g.labels), torch.from_numpy(g.train_mask)
    x = torch.from_numpy(g.features)
    losses = []
    for epoch in range(1, steps + 1):
        key = DropoutKey(SEED, epoch)
        opt.zero_grad()
        h = torch.cat([emb, x], 1) if x.shape[1] else emb
        for l in range(2):
            if l:
                h = torch.relu(h)
            h = wg.dropout(h, DROPOUT, key, l)
            w, b = p[f"model.convs.{l}.lin.weight"], p[f"model.convs.{l}.bias"]
            h = wg.propagate(h @ w.t(), "gcn", True) + b
        loss = F.cross_entropy(h[train], y[train], reduction="sum") / int(train.sum())
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    st = opt.state[emb]
    return emb.detach().numpy(), st["exp_avg"].numpy(), st["exp_avg_sq"].numpy(), \
        {k: v.detach().numpy() for k, v in p.items()}, np.array(losses)


def test_init_keyed_by_node_id():
    """A row depends on (seed, key, original ID) only: any subset, in any order, draws the same rows; N(0, 1)."""
    ids = np.arange(5000)
    full = embedding_init(ids, 7, seed=4, key=1)
    perm = np.random.default_rng(0).permutation(ids)[:900]
    assert np.array_equal(embedding_init(perm, 7, seed=4, key=1), full[perm])
    assert not np.array_equal(embedding_init(ids, 7, seed=5, key=1), full)
    assert not np.array_equal(embedding_init(ids, 7, seed=4, key=2), full)
    assert abs(full.mean()) < 0.03 and abs(full.std() - 1) < 0.03 and np.isfinite(full).all()


@pytest.mark.parametrize("P,features", [(1, 0), (2, 0), (3, 0), (4, 0), (3, 4)])
def test_embeddings_equal_one_process(P, features, tmp_path):
    g = random_graph(n=80, f=features, seed=5)
    partition(g, P, tmp_path / "parts")
    run_mpi(P, "tests.mpi_embed", tmp_path / "parts", tmp_path / "out.npz", STEPS, "--dropout", DROPOUT)
    res = np.load(tmp_path / "out.npz")
    assert str(res["name"]) == "embedding.weight"
    init = {k[len("init/"):]: res[k] for k in res.files if k.startswith("init/")}
    assert res["emb_init"].shape == (g.num_nodes, DIM)
    assert np.array_equal(res["emb_init"], embedding_init(np.arange(g.num_nodes), DIM, SEED, 0))
    emb, m, v, final, losses = reference(g, init, res["emb_init"], STEPS)
    assert rel_err(res["loss"], losses) <= TOL
    assert float(res["emb_step"]) == STEPS
    for k, want in (("emb", emb), ("emb_m", m), ("emb_v", v)):
        assert rel_err(res[k], want) <= TOL, f"P={P}: {k}"
    assert rel_err(res["emb"] - res["emb_init"], emb - res["emb_init"]) <= TOL   # (the updates, not only the init)
    for k, want in final.items():
        assert rel_err(res[f"final/{k}"], want) <= TOL, f"P={P}: {k}"


def test_train_without_features(tmp_path):
    """g3-train on a graph without features (feature_dim 0): refused without --node-embedding (one line, every
    rank exits non-zero); with it, the built-in GCN and the same GCN from a --model-file train the same model
    (model.pt holds the replicated parameters only)."""
    from tests.test_model_file import EXAMPLES, params, train
    g = random_graph(n=90, f=0, seed=8)
    partition(g, 2, tmp_path / "parts")
    r = train(2, tmp_path / "parts", tmp_path / "none", "--epochs", "2", check=False)
    assert r.returncode != 0
    assert "no node features (feature_dim 0): give the model learned ones with --node-embedding DIM" in r.stderr
    assert not (tmp_path / "none").exists()
    args = ["--epochs", "4", "--dropout", "0", "--hidden", "8", "--seed", "3", "--node-embedding", "5"]
    train(2, tmp_path / "parts", tmp_path / "builtin", "--model", "gcn", *args)
    train(2, tmp_path / "parts", tmp_path / "user", "--model-file", f"{EXAMPLES / 'user_gcn.py'}:build", *args)
    a, b = params(tmp_path / "builtin"), params(tmp_path / "user")
    assert a.keys() == b.keys() and not any(k.startswith("embedding.") for k in a)
    assert a["model.convs.0.lin.weight"].shape == (8, 5)
    for k in a:
        assert torch.linalg.norm(a[k] - b[k]) <= 1e-5 * torch.linalg.norm(a[k]), k


def _shards(run) -> list:
    import torch as t
    from g3mpi.train.checkpoint import SHARDS_DIR
    (tag,) = [d for d in (run / SHARDS_DIR).iterdir()]     # (the older checkpoints' shards are gone)
    return [t.load(f, weights_only=True) for f in sorted(tag.iterdir())]


def test_resume_and_embeddings_h5(tmp_path):
    """A run checkpointed at epoch 3 and resumed to 6 ends with the straight run's table, Adam moments (every
    rank's shard) and replicated state, bit for bit; embeddings.h5 holds the best model's table by original ID
    (every row written once); resuming on another number of ranks, or without a rank's shard, is refused."""
    import h5py
    from g3mpi.train.checkpoint import SHARDS_DIR
    from tests.test_model_file import train
    from g3mpi.format import write_graph
    from tests.partition_graphs import partition as g3_partition
    g = random_graph(n=90, f=3, seed=8)
    write_graph(tmp_path / "graph.h5", g)
    for P in (2, 3):   # (g3-partition records the graph: a resume may move to the other partition, but not here)
        g3_partition(tmp_path / "graph.h5", tmp_path / f"p{P}", P, "random", inproc=True)
    args = ["--epochs", "6", "--hidden", "8", "--seed", "2", "--node-embedding", "4", "--dropout", "0.3"]
    train(2, tmp_path / "p2", tmp_path / "straight", *args)
    train(2, tmp_path / "p2", tmp_path / "cut", *args[2:], "--epochs", "3", "--checkpoint-every", "1")
    r = train(3, None, None, "--resume", tmp_path / "cut", "--epochs", "6", "--parts", tmp_path / "p3",
              check=False)
    assert r.returncode != 0 and "resume on that partition with 2 ranks" in r.stderr
    train(2, None, None, "--resume", tmp_path / "cut", "--epochs", "6")
    a, b = _shards(tmp_path / "straight"), _shards(tmp_path / "cut")
    for x, y in zip(a, b):
        assert torch.equal(x["orig_ids"], y["orig_ids"])
        assert x["model"].keys() == {"embedding.weight"} and torch.equal(x["model"]["embedding.weight"],
                                                                        y["model"]["embedding.weight"])
        (i, st), = x["optimizer"].items()
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(st[k], y["optimizer"][i][k]), k
    ca = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    cb = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert "embedding.weight" not in ca["model"] and ca["model"].keys() == cb["model"].keys()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    with h5py.File(tmp_path / "straight" / "embeddings.h5") as f:
        assert f.attrs["format"] == "g3mpi-embeddings"
        emb, best = f["embedding"][:], int(f.attrs["best_epoch"])
    assert emb.shape == (g.num_nodes, 4) and not np.isnan(emb).any()
    with h5py.File(tmp_path / "cut" / "embeddings.h5") as f:
        assert np.array_equal(f["embedding"][:], emb) and int(f.attrs["best_epoch"]) == best
    best_rows = {int(i): r for s in a for i, r in zip(s["orig_ids"], s["best"]["embedding.weight"].numpy())}
    assert np.array_equal(np.stack([best_rows[i] for i in range(g.num_nodes)]), emb)
    (tag,) = (tmp_path / "cut" / SHARDS_DIR).iterdir()
    (tag / "shard-00001.pt").unlink()
    r = train(2, None, None, "--resume", tmp_path / "cut", "--epochs", "8", check=False)
    assert r.returncode != 0 and "shard-00001.pt: this rank's shard of the checkpoint is missing" in r.stderr
