"""A rank lets go of its part's local CSR once the forms its layers use are built (``DistGraph.release_edges``,
after g3-train's first training forward): a form made later reads it again from the part file
(``read_part_edges``), which must still hold the same edges."""
from __future__ import annotations

from functools import partial

import h5py
import numpy as np
import pytest
import torch

from tests.graphs import partition, random_graph


@pytest.fixture
def parts(tmp_path):
    partition(random_graph(n=150, f=5, seed=3), 2, tmp_path / "parts", seed=3)
    return tmp_path / "parts"


def _graph(parts, reload: bool):
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part, read_part_edges
    from g3mpi.ops import DistGraph
    part = read_part(parts, 1, read_meta(parts))
    ctx = CommContext(MPI.COMM_SELF)
    return part, DistGraph(part, ctx, reload_edges=partial(read_part_edges, parts, part) if reload else None)


def _forms(graph, kind):
    bm = graph.blocks(kind)
    return [bm.local, bm.local_t] + [m for nb in bm.neighbours for m in (nb.mat, nb.mat_t)]


def _same(a, b):
    return all(torch.equal(x.crow_indices(), y.crow_indices()) and torch.equal(x.col_indices(), y.col_indices())
               and torch.equal(x.values(), y.values()) for x, y in zip(a, b)) and len(a) == len(b)


def test_forms_after_release_equal_those_before(parts):
    """Released after the GCN blocks' row groups are built: the part holds no CSR any more; a kind asked for
    afterwards (mean, gat) and a form of the released kind made afterwards (its torch blocks) equal those of a
    graph that kept it; without a way to read it again nothing is released."""
    part, g = _graph(parts, reload=True)
    _, ref = _graph(parts, reload=False)
    n_edges = part.num_local_edges
    g.row_groups("gcn")
    assert g.release_edges()
    assert part.indptr is None and part.indices is None and part.num_local_edges == n_edges > 0
    for kind in ("gcn", "mean", "gat"):
        assert _same(_forms(g, kind), _forms(ref, kind)), kind
    assert part.indptr is None      # (read again for each form, never kept)
    assert not ref.release_edges() and ref.part.indptr is not None


def test_a_replaced_part_file_is_refused(parts):
    """The part file rewritten with other edges between the release and a later form: one clear error naming the
    file, not a form of the new edges."""
    from g3mpi.format import FormatError
    from g3mpi.format.partition import part_name
    part, g = _graph(parts, reload=True)
    g.release_edges()
    path = parts / part_name(1)
    with h5py.File(path, "r+") as f:
        ind = f["indices"][()]
        ptr = f["indptr"][()]
        row = int(np.argmax(np.diff(ptr)))      # two entries of one row swapped: still a valid CSR
        a = int(ptr[row])
        ind[a], ind[a + 1] = ind[a + 1], ind[a]
        f["indices"][...] = ind
    with pytest.raises(FormatError, match=rf"{part_name(1)}.*changed since this run loaded it"):
        g.blocks("gcn").local


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_trainer_releases_after_the_first_forward(tmp_path, monkeypatch, model):
    """A trainer drops the CSR in its first training step, right after the forward, and trains on exactly as a
    trainer that keeps it (``release_edges=False``, the bench's): equal losses and parameters over 3 epochs with
    evaluations, and nothing read again (every form was built in the first forward)."""
    from mpi4py import MPI

    from g3mpi.format import read_meta, read_part
    from g3mpi.train import trainer as trainer_mod
    from g3mpi.train.config import TrainConfig
    from g3mpi.train.trainer import Trainer
    reads = []
    real = trainer_mod.read_part_edges
    monkeypatch.setattr(trainer_mod, "read_part_edges", lambda *a: reads.append(1) or real(*a))
    partition(random_graph(n=200, f=6, c=3, seed=5), 1, tmp_path / "p1", seed=5)
    meta = read_meta(tmp_path / "p1")
    runs = []
    for release in (True, False):
        part = read_part(tmp_path / "p1", 0, meta)
        sizes = {s: int(getattr(part, f"{s}_mask").sum()) for s in ("train", "val", "test")}
        cfg = TrainConfig(parts=str(tmp_path / "p1"), out=str(tmp_path / "run"), model=model, hidden=8, heads=2,
                          epochs=3, dropout=0.5)
        tr = Trainer(cfg, MPI.COMM_SELF, part, meta, sizes, release_edges=release)
        try:
            losses = []
            for epoch in (1, 2, 3):
                losses.append(tr.train_step(epoch)["loss"])
                assert (part.indptr is None) == release
                losses.append(tr.evaluate())
            runs.append((losses, [p.detach().clone() for p in tr.params]))
        finally:
            tr.close()
    assert runs[0][0] == runs[1][0] and not reads
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)
