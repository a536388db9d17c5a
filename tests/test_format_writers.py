"""g3mpi.format's writers: write_part, atomic replacement of files and directories, stale temporaries."""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.partition_graphs import random_graph, write
from data_tools import build
from g3mpi.format import PARTITION_VERSION, FormatError, load_graph, write_part
from g3mpi.format.partition import ARRAYS, SCALARS, PartFeatures, _narrowest
from g3mpi.format.schema import PARTITION_VERSION


def test_write_part_same_file_as_h5py_high_level(tmp_path):
    """write_part makes its attributes and datasets through h5py's low-level API (the high-level one cost as much
    again in Python per object): the file is the one h5py's high-level calls write, byte for byte, with and
    without features in memory. A change of h5py's defaults (timestamps, attribute order) or of the two helpers
    shows here."""
    import dataclasses
    from g3mpi.format.checksums import array_sha256
    from g3mpi.format.schema import row_chunks
    g = random_graph(n=60, m=300, seed=3, feature_dim=5)
    part = next(build.build_parts(g, np.arange(g.num_nodes) % 3, 3, "f" * 32))[0]
    for pd in (part, dataclasses.replace(part, features=None)):
        write_part(tmp_path / "low.h5", pd, force=True)
        with h5py.File(tmp_path / "high.h5", "w") as f:   # write_part as it was, all high-level
            f.attrs["format"] = "g3mpi-part"
            f.attrs["version"] = PARTITION_VERSION
            for k in SCALARS:
                f.attrs[k] = getattr(pd, k)
            for k in ARRAYS:
                if k == "features":
                    shape = (pd.num_owned, pd.feature_dim)
                    chunks = (row_chunks(shape[0], 4 * shape[1]), shape[1])
                    if pd.features is None:
                        f.create_dataset(k, shape=shape, dtype=np.float32, chunks=chunks)
                        continue
                arr = _narrowest(k, np.ascontiguousarray(getattr(pd, k)))   # (int32 where the values fit)
                f.create_dataset(k, data=arr, chunks=chunks if k == "features" else None).attrs["sha256"] = \
                    array_sha256(arr)
        assert (tmp_path / "low.h5").read_bytes() == (tmp_path / "high.h5").read_bytes(), pd.features is None


def test_write_part_in_place(tmp_path, monkeypatch):
    """atomic=False (a part inside atomic_dir's temporary directory): the file itself, the same content as the
    atomic write; an existing file is refused, and a failed write removes what it began."""
    g = random_graph(n=40, m=100, seed=2)
    part = next(build.build_parts(g, np.arange(g.num_nodes) % 2, 2, "id"))[0]
    a = write_part(tmp_path / "a.h5", part)
    b = write_part(tmp_path / "b.h5", part, atomic=False)
    assert a == b and sorted(x.name for x in tmp_path.iterdir()) == ["a.h5", "b.h5"]
    with pytest.raises(FormatError, match="b.h5: output already exists"):
        write_part(tmp_path / "b.h5", part, atomic=False)

    def fail(*args, **kw):
        raise OSError("disk full")
    monkeypatch.setattr("g3mpi.format.partition.array_sha256", fail)
    with pytest.raises(OSError, match="disk full"):
        write_part(tmp_path / "c.h5", part, atomic=False)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.h5", "b.h5"]


def test_part_features_must_be_complete(tmp_path):
    g = random_graph(n=40, m=100, seed=2)
    a = np.arange(g.num_nodes) % 2
    part = next(build.build_parts(load_graph_lean(g, tmp_path), a, 2, "id"))[0]
    assert part.features is None
    assert write_part(tmp_path / "p.h5", part) is None
    w = PartFeatures(tmp_path / "p.h5")
    w.append(np.zeros((part.num_owned - 1, part.feature_dim), np.float32))
    with pytest.raises(FormatError, match=f"{part.num_owned - 1} of {part.num_owned} rows were written"):
        w.close()


def load_graph_lean(g, tmp_path):
    write(g, tmp_path / "lean.h5")
    return load_graph(tmp_path / "lean.h5", features=False)


def test_atomic_dir_replaces_in_one_step_or_restores(monkeypatch, tmp_path):
    """--force's replacement of a partition directory: swapped in one step where the filesystem can (nothing
    else left beside it); where it cannot, an error or Ctrl-C between the two renames puts the old one back
    (before, the old directory stayed in .NAME.*.old/x and NAME was gone)."""
    from g3mpi.format import atomic
    out = tmp_path / "out"
    out.mkdir()
    (out / "meta.json").write_text("old")
    with atomic.atomic_dir(out, "meta.json", force=True) as tmp:
        (tmp / "meta.json").write_text("new")
    assert [f.read_text() for f in out.iterdir()] == ["new"] and [f.name for f in tmp_path.iterdir()] == ["out"]
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    real = os.replace

    def replace(a, b):
        if Path(a).name.endswith(".tmp"):
            raise KeyboardInterrupt
        real(a, b)
    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_dir(out, "meta.json", force=True) as tmp:
            (tmp / "meta.json").write_text("newer")
    assert [f.read_text() for f in out.iterdir()] == ["new"] and [f.name for f in tmp_path.iterdir()] == ["out"]
    monkeypatch.setattr(atomic.os, "replace", real)
    with atomic.atomic_dir(out, "meta.json", force=True) as tmp:      # the two-step path itself
        (tmp / "meta.json").write_text("newest")
    assert [f.read_text() for f in out.iterdir()] == ["newest"] and [f.name for f in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("swap", [True, False])
def test_atomic_dir_replaces_only_its_own_kind(monkeypatch, tmp_path, swap):
    """atomic_dir with force replaces an empty directory (nothing left beside it, either way it renames), and
    refuses, even with force, a file and a non-empty directory without the marker, leaving them as they were
    (before, a file was replaced and a directory of the user's deleted)."""
    from g3mpi.format import atomic
    if not swap:
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    with atomic.atomic_dir(out, "meta.json", force=True) as tmp:
        (tmp / "meta.json").write_text("new")
    assert [f.name for f in out.iterdir()] == ["meta.json"] and [f.name for f in tmp_path.iterdir()] == ["out"]
    afile, adir = tmp_path / "afile", tmp_path / "adir"
    afile.write_text("a file")
    adir.mkdir()
    (adir / "notes.txt").write_text("mine")
    for path, why in ((afile, "is a file, not an output directory"),
                      (adir, "is a directory with no meta.json (not one this tool wrote) and not empty")):
        with pytest.raises(FormatError) as e:
            with atomic.atomic_dir(path, "meta.json", force=True) as tmp:
                (tmp / "meta.json").write_text("new")
        assert str(e.value) == f"{path}: {why}: not replaced, even with --force (remove it yourself or choose " \
                               f"another output)"
    assert afile.read_text() == "a file" and [f.read_text() for f in adir.iterdir()] == ["mine"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["adir", "afile", "out"]


def test_atomic_file_replaces_only_a_file(tmp_path):
    """atomic_file with force (every file g3mpi writes: a graph.h5, a run directory's files, a plot, a benchmark's
    JSON) replaces a regular file and refuses anything else, leaving it as it was: before, a directory at the
    path was deleted with everything in it."""
    from g3mpi.format import atomic, jsonio
    out = tmp_path / "out.json"
    out.write_text("old")
    jsonio.write_json(out, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}
    adir = tmp_path / "adir"
    adir.mkdir()
    (adir / "notes.txt").write_text("mine")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, why in ((adir, "is a directory, not an output file"),
                      (fifo, "is not a regular file (a device, FIFO or socket?), not an output file")):
        for force in (False, True):
            with pytest.raises(FormatError) as e:
                with atomic.atomic_file(path, force=force) as tmp:
                    tmp.write_text("new")
            assert str(e.value) == f"{path}: {why}: not replaced, even with --force (remove it yourself or " \
                                   f"choose another output)"
    assert [f.read_text() for f in adir.iterdir()] == ["mine"] and fifo.is_fifo()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["adir", "fifo", "out.json"], "nothing left behind"


def test_stale_temporaries_only_of_dead_processes_of_this_host(tmp_path):
    """Only a temporary of this host whose process is gone is removed: a live writer's, another host's and any
    other name stay; an old directory moved aside by atomic_dir's two-step replace comes back if the output is
    missing."""
    import socket
    import subprocess
    import sys
    from g3mpi.format import stale
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    keep = [f".out.{host}-{os.getpid()}.abc.tmp", f".out.{host}x-{dead}.abc.tmp", f".out.other-{dead}.abc.tmp",
            f".out2.{host}-{dead}.abc.tmp", f"out.{host}-{dead}.abc.tmp", f".out.{host}-{dead}.abc.tmp.bak"]
    gone = [f".out.{host}-{dead}.abc.tmp", f".out.{host}-{dead}.x_y.tmp"]
    for name in keep + gone[:1]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
    (tmp_path / gone[1]).write_text("a file")
    old = tmp_path / f".out.{host}-{dead}.q.old"
    (old / "x").mkdir(parents=True)
    (old / "x" / "meta.json").write_text("{}")
    removed = stale.remove_stale_temporaries(tmp_path / "out")
    assert sorted(p.name for p in removed) == sorted(gone + [old.name])
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(keep + ["out"])
    assert [f.name for f in (tmp_path / "out").iterdir()] == ["meta.json"]


def test_part_integers_stored_in_the_narrowest_type_and_read_as_int64(tmp_path):
    """The per-node integer datasets are stored as int32 where every value fits (half the bytes), int64 where one
    does not (an original ID past 2^31), and read back as the int64 arrays that were written."""
    from g3mpi.format import read_meta, read_part
    from g3mpi.format.partition import NARROWED
    from tests.graphs import partition
    g = random_graph(n=60, m=300, seed=3, feature_dim=5)
    partition(g, 3, tmp_path / "parts")
    meta = read_meta(tmp_path / "parts")
    want = next(build.build_parts(g, np.arange(g.num_nodes) % 3, 3, "f" * 32))[0]
    with h5py.File(tmp_path / "parts" / "part-00001.h5") as f:
        assert {k: f[k].dtype for k in NARROWED} == {k: np.dtype(np.int32) for k in NARROWED}
    part = read_part(tmp_path / "parts", 1, meta)
    assert all(getattr(part, k).dtype == np.int64 for k in NARROWED)
    write_part(tmp_path / "w.h5", want)
    with h5py.File(tmp_path / "w.h5") as f:
        for k in NARROWED:
            assert np.array_equal(f[k][()].astype(np.int64), getattr(want, k)), k
    wide = np.array([0, 2 ** 31, 5])
    assert _narrowest("orig_ids", wide).dtype == np.int64 and _narrowest("indices", want.orig_ids) is want.orig_ids
