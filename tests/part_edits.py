"""A module's partition (2 parts of a random graph), copied for each test that damages it, and the edits that
damage a part, meta.json or an HDF5 attribute while keeping every checksum valid (so that the check under test,
not the checksum, is what refuses it)."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from g3mpi.format import array_sha256, file_sha256, part_name, read_meta
from g3mpi.format.partition import META_NAME, write_meta
from tests.graphs import partition, random_graph


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fmt") / "p2"
    partition(random_graph(n=120, seed=5), 2, d)
    return d


@pytest.fixture
def copy(parts, tmp_path):
    import shutil
    out = tmp_path / "p2"
    shutil.copytree(parts, out)
    return out


def edit_part(d, p, edit) -> None:
    """Apply ``edit(h5 file)`` to part p, then record the file's new checksum in meta.json."""
    path = d / part_name(p)
    with h5py.File(path, "r+") as f:
        edit(f)
    meta = read_meta(d)
    meta["files"][path.name] = file_sha256(path)
    write_meta(d, meta)


def replace_ds(f, name, value) -> None:
    del f[name]
    f.create_dataset(name, data=value).attrs["sha256"] = array_sha256(np.asarray(value))


def edit_meta(d, **changes) -> None:
    meta = json.loads((d / META_NAME).read_text())
    meta.update(changes)
    (d / META_NAME).write_text(json.dumps(meta))


def damage_attribute(path, name: bytes) -> None:
    """Overwrite 4 bytes of the datatype message of attribute ``name`` (right after its name in the object
    header): h5py then raises RuntimeError ("Can't synchronously determine if attribute exists by name
    (... possibly corrupted file ...)"), not OSError, when the attribute is looked up."""
    data = bytearray(path.read_bytes())
    i = data.index(name + b"\0") + len(name) + 8
    data[i:i + 4] = b"\xff" * 4
    path.write_bytes(bytes(data))


def graph_file(tmp_path, edit):
    """A small graph.h5 edited by ``edit(h5 file)``, every dataset re-checksummed (only the structural checks can
    tell)."""
    from g3mpi.format import write_graph
    path = tmp_path / "g.h5"
    write_graph(path, random_graph(n=40, seed=1))
    with h5py.File(path, "r+") as f:
        edit(f)
        for ds in f.values():
            ds.attrs["sha256"] = array_sha256(np.ascontiguousarray(ds[()]))
    return path
