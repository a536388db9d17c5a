"""Multi-label labels on disk: the npz and edgelist importers, graph.h5 and the part files of every partitioner
(metis in one process, stream on 2 ranks), their checks, and the version message of an older graph file."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from g3mpi.format import FormatError, load_graph, read_meta, read_part
from tests.conftest import run_module, run_mpi
from tests.graphs import random_graph

SLOW_TESTS = ("test_npz_multilabel_through_prepare_and_both_partitioners", "test_edgelist_takes_multilabel_labels",
              "test_multilabel_labels_out_of_range_are_refused")


def multilabel_npz(path, n=80, C=3, seed=0):
    """A random graph's npz with y [n, C]: 0/1 floats, NaN unknown, one node with no known entry."""
    g = random_graph(n=n, seed=seed)
    rng = np.random.default_rng(seed)
    y = (rng.random((n, C)) < 0.4).astype(np.float64)
    y[rng.random((n, C)) < 0.1] = np.nan
    y[5] = np.nan
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    np.savez(path, edge_index=np.stack([g.indices.astype(np.int64), dst]), x=g.features, y=y)
    return y


def test_npz_multilabel_through_prepare_and_both_partitioners(tmp_path):
    y = multilabel_npz(tmp_path / "g.npz")
    run_module("data_tools.prepare", "npz", tmp_path / "g.npz", "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    want = np.where(np.isnan(y), -1, y).astype(np.int8)
    assert g.labels.dtype == np.int8 and np.array_equal(g.labels, want) and g.attrs["num_classes"] == 3
    assert not (g.train_mask | g.val_mask | g.test_mask)[5]   # no known entry: unlabelled, in no split
    run_module("data_tools.partition", tmp_path / "g.h5", "--parts", 2, "--method", "metis", "--out", tmp_path / "m")
    run_mpi(2, "data_tools.partition", tmp_path / "g.h5", "--parts", 3, "--method", "stream", "--out", tmp_path / "s")
    for d, P in ((tmp_path / "m", 2), (tmp_path / "s", 3)):
        assert read_meta(d)["num_classes"] == 3
        for p in range(P):
            part = read_part(d, p)
            assert part.labels.shape == (part.num_owned, 3)
            assert np.array_equal(part.labels, want[part.orig_ids])


def test_edgelist_takes_multilabel_labels(tmp_path):
    (tmp_path / "e.csv").write_text("0,1\n1,2\n2,0\n3,1\n")
    np.save(tmp_path / "y.npy", np.array([[1, 0], [0, 1], [1, 1], [-1, 0]], dtype=np.int64))
    run_module("data_tools.prepare", "edgelist", tmp_path / "e.csv", "--labels", tmp_path / "y.npy", "--out",
               tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert g.labels.tolist() == [[1, 0], [0, 1], [1, 1], [-1, 0]] and g.attrs["num_classes"] == 2
    np.save(tmp_path / "bad.npy", np.array([[1, 2], [0, 1], [1, 1], [0, 0]]))
    p = run_module("data_tools.prepare", "edgelist", tmp_path / "e.csv", "--labels", tmp_path / "bad.npy", "--out",
                   tmp_path / "bad.h5", check=False)
    assert p.returncode != 0 and "multi-label label 2 (row 0, column 1) is not 0 or 1" in p.stderr


def test_multilabel_labels_out_of_range_are_refused(tmp_path):
    from tests.partition_graphs import write
    g = random_graph(n=40, seed=2)
    g.labels = np.zeros((40, 3), dtype=np.int8)
    g.attrs["num_classes"] = 3
    write(g, tmp_path / "g.h5")
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        f["labels"][0, 1] = 2
    with pytest.raises(FormatError, match="multi-label labels out of range"):
        load_graph(tmp_path / "g.h5", verify=False)


def test_an_older_graph_file_asks_to_prepare_again(tmp_path):
    from tests.partition_graphs import write
    write(random_graph(n=20, seed=1), tmp_path / "g.h5")
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        f.attrs["version"] = 1
    with pytest.raises(FormatError, match=r"format version 1 is not supported \(reads versions 2 to 3\); written by an "
                                          "older g3mpi: prepare it again with g3-prepare"):
        load_graph(tmp_path / "g.h5")
