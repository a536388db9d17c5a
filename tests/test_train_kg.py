"""Knowledge-graph completion with ``g3-train --task link --decoder distmult`` (issue 51 item 4): a generated
graph in triple files, learned node embeddings, DistMult over the pair exchange with corrupted heads and tails
keyed by (seed, epoch, triple), filtered ranking of val and test against every entity. The same model for P = 1,
2 and 4: every epoch's loss (<= 1e-5 relative) and the filtered MRR and Hits@1/3/10."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_module
from tests.train_runs import error_lines, train

SLOW_TESTS = ("test_distmult_same_model_and_filtered_mrr_for_every_p", "test_distmult_needs_edge_types",
              "test_rgcn_node_embedding_distmult_equals_one_process")
ARGS = ["--task", "link", "--decoder", "distmult", "--metric", "mrr", "--node-embedding", "8", "--hidden", "16",
        "--embed-dim", "16", "--dropout", "0", "--epochs", "3", "--no-plots"]


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    d = tmp_path_factory.mktemp("kg")
    run_module("data_tools.importers.triples", d / "txt", "--entities", 200, "--relations", 4, "--triples", 1500,
               "--seed", 1)
    run_module("data_tools.prepare", "triples", d / "txt", "--out", d / "g.h5")
    for P in (1, 2, 4):
        run_module("data_tools.partition", d / "g.h5", "--parts", P, "--method", "random", "--out", d / f"p{P}")
    return d


def losses(run) -> list:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def test_distmult_same_model_and_filtered_mrr_for_every_p(kg, tmp_path):
    got = {}
    for P in (1, 2, 4):
        train(P, kg / f"p{P}", tmp_path / f"r{P}", *ARGS)
        got[P] = (losses(tmp_path / f"r{P}"), json.loads((tmp_path / f"r{P}" / "summary.json").read_text()))
    ref_loss, ref = got[1]
    assert len(ref_loss) == 3 and ref_loss[-1] < ref_loss[0]
    keys = [f"{s}_{m}" for s in ("val", "test") for m in ("mrr", "hits@1", "hits@3", "hits@10")]
    assert all(0 <= ref[k] <= 1 for k in keys) and ref["test_mrr"] > 0, ref
    for P in (2, 4):
        loss, s = got[P]
        assert np.allclose(loss, ref_loss, rtol=1e-5, atol=0), (P, loss, ref_loss)
        for k in keys:
            assert s[k] == pytest.approx(ref[k], abs=1e-6), (P, k, s[k], ref[k])


def test_distmult_needs_edge_types(tmp_path):
    from tests.graphs import random_graph
    import data_tools
    from data_tools.build import write_partition
    from g3mpi.format import load_graph
    g = random_graph(n=60, seed=2)
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    data_tools.write_graph(tmp_path / "g.h5", np.stack([g.indices, rows]), g.features, y=g.labels,
                           link_split=(0.8, 0.1, 0.1))
    write_partition(load_graph(tmp_path / "g.h5"), np.arange(60) % 2, 2, tmp_path / "p2", method="random", seed=0)
    p = train(2, tmp_path / "p2", tmp_path / "r", *ARGS, check=False)
    lines = error_lines(p.stderr)
    assert p.returncode != 0 and sorted(lines) == [0, 1], p.stderr
    assert all(len(v) == 1 and "decoder distmult scores triples" in v[0] for v in lines.values()), p.stderr
    assert not (tmp_path / "r").exists()


def test_rgcn_node_embedding_distmult_equals_one_process(kg, tmp_path):
    """``--model rgcn`` (basis decomposition) over ``--node-embedding`` with the DistMult decoder: at P = 2 the
    same model as one process: every epoch's loss, the filtered metrics, the replicated parameters (model.pt)
    and the learned table (embeddings.h5, by original ID) within 1e-5 relative."""
    import h5py
    import torch
    args = [*ARGS, "--model", "rgcn", "--num-bases", "2", "--layers", "2", "--lr", "0.02"]
    got = {}
    for P in (1, 2):
        run = tmp_path / f"r{P}"
        train(P, kg / f"p{P}", run, *args)
        with h5py.File(run / "embeddings.h5") as f:
            emb = f["embedding"][:]
        got[P] = (losses(run), json.loads((run / "summary.json").read_text()),
                  torch.load(run / "model.pt", weights_only=True), emb)
    (l1, s1, m1, e1), (l2, s2, m2, e2) = got[1], got[2]
    assert len(l1) == 3 and l1[-1] < l1[0]
    assert np.allclose(l2, l1, rtol=1e-5, atol=0), (l2, l1)
    for k in [f"{s}_{m}" for s in ("val", "test") for m in ("mrr", "hits@1", "hits@3", "hits@10")]:
        assert s2[k] == pytest.approx(s1[k], abs=1e-6), (k, s2[k], s1[k])
    assert any(k.endswith(".comp") for k in m1) and m1.keys() == m2.keys()
    for k in m1:
        assert torch.linalg.norm(m2[k] - m1[k]) <= 1e-5 * torch.linalg.norm(m1[k]), k
    assert e1.shape == (200, 8) and np.linalg.norm(e2 - e1) <= 1e-5 * np.linalg.norm(e1)
