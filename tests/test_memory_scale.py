"""A rank's memory is O(owned + halo), never O(whole graph): no array of the graph's node or edge count on a rank
that owns a small share of it, through loading, training, evaluation, predictions.h5 and the checkpoint.

The graph is a ring of N nodes (each node linked to the two nearest on either side); part 0 owns a short arc
of it, so its owned rows, halo rows and local edges are all a few hundred times fewer than N. The sizes are those
of the structures the rank holds (every array and tensor left after the run) and tracemalloc's peak during each
stage that touches the data (numpy's and h5py's buffers and Python's objects, not torch's; deterministic, unlike
RSS): the bound is one N-long int64 array.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_tools.build import write_partition
from g3mpi.format import Graph
from tests.conftest import run_mpi
from tests.graphs import csr_from_edges

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_small_rank_holds_no_array_of_the_whole_graph",)

N, SMALL, F, C = 300_000, 1000, 8, 4


@pytest.fixture(scope="module")
def skewed_parts(tmp_path_factory):
    ids = np.arange(N)
    src = np.concatenate([ids, ids, ids, ids])
    dst = np.concatenate([(ids + 1) % N, (ids - 1) % N, (ids + 2) % N, (ids - 2) % N])
    indptr, indices = csr_from_edges(src, dst, N)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, F)).astype(np.float32)
    y = rng.integers(0, C, N)
    split = rng.random(N)
    g = Graph(indptr, indices, x, y, split < 0.5, (split >= 0.5) & (split < 0.75), split >= 0.75,
              dict(num_classes=C, source=f"ring:n={N}"))
    asg = np.ones(N, np.int64)
    asg[:SMALL] = 0
    out = tmp_path_factory.mktemp("skewed") / "parts"
    write_partition(g, asg, 2, out, method="random", seed=0)
    return out


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_small_rank_holds_no_array_of_the_whole_graph(model, skewed_parts, tmp_path):
    out = tmp_path / "sizes.json"
    args = ["--parts", skewed_parts, "--out", tmp_path / "run", "--model", model, "--epochs", "1", "--hidden", "8",
            "--heads", "2", "--no-progress", "--no-plots"]
    run_mpi(2, "tests.mpi_memory", out, "--", *args, timeout=600)
    small, big = json.loads(out.read_text())
    assert small["status"] == big["status"] == 0
    assert small["num_nodes"] == N and small["owned"] == SMALL and small["halo"] == 4
    rows = small["owned"] + small["halo"] + small["local_edges"]   # 1000 + 4 + 4000
    # the longest dimension of anything part 0 holds: edges with their self loops and heads, never N
    assert small["largest"][0]["longest"] <= 2 * rows, small["largest"]
    assert small["largest"][0]["longest"] < N // 20, small["largest"]
    # the part with N - 1000 nodes does hold arrays that long: the inspection sees them
    assert big["largest"][0]["longest"] >= N - SMALL
    # no stage allocates an N-long int64 array on part 0, even for a moment (what they do allocate, 0.2-1.1 MB,
    # is mostly Python objects: torch.manual_seed caches the source lines of its call stack)
    assert max(small["stages"].values()) < 8 * N, small["stages"]
    assert len(small["stages"]) == 5 and min(big["stages"].values()) > 0, big["stages"]
    assert big["stages"]["read_part"] > 4 * N * F


def test_memory_model_counts_the_part_as_loaded(tmp_path):
    """The model's ``part`` term (docs/MEMORY.md) is the bytes of the part's arrays as read_part
    returns them, up to the neighbour lists (a few integers per neighbouring part)."""
    from g3mpi.format import read_meta, read_part
    from g3mpi.format.partition import ARRAYS
    from g3mpi.train.memory import rank_memory
    from tests.graphs import partition, random_graph

    partition(random_graph(n=400, f=F, c=C, seed=1), 3, tmp_path / "p3")
    meta = read_meta(tmp_path / "p3")
    for p, figures in enumerate(meta["parts"]):
        part = read_part(tmp_path / "p3", p, meta)
        loaded = sum(getattr(part, k).nbytes for k in ARRAYS)
        lists = sum(getattr(part, k).nbytes for k in ("recv_parts", "recv_offsets", "send_parts", "send_offsets"))
        model = rank_memory("gcn", owned=figures["owned"], halo=figures["halo"], send=figures["send"],
                            edges=figures["local_edges"], feature_dim=F, hidden=16, num_classes=C)
        assert model["part"] == loaded - lists
