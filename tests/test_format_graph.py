"""Reading a graph file (g3mpi.format.graph): damaged attributes, integer types, row order, index range."""
from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import partition, random_graph
from tests.part_edits import damage_attribute, graph_file, replace_ds
from g3mpi.format import FormatError, read_part


def test_damaged_attribute_header_in_a_graph(tmp_path):
    """The same in graph.h5: g3-partition and g3-inspect ended with a RuntimeError traceback."""
    from g3mpi.format import load_graph, write_graph
    path = tmp_path / "g.h5"
    write_graph(path, random_graph(n=40, seed=1))
    damage_attribute(path, b"num_classes")
    with pytest.raises(FormatError, match="g.h5: not a readable HDF5 file .*corrupt"):
        load_graph(path)


def test_damaged_attribute_value_in_a_graph(tmp_path):
    """A dataset's sha256 attribute (a variable-length string) whose global-heap address points past the end of
    the file: h5py's OSError ("address of object past end of allocation") escaped load_graph, so g3-inspect and
    g3-partition ended with a traceback (found by writing random bytes into a graph file)."""
    from g3mpi.format import load_graph, write_graph
    path = tmp_path / "g.h5"
    write_graph(path, random_graph(n=40, seed=1))
    data = bytearray(path.read_bytes())
    i = data.index(b"sha256\0")
    assert data[i + 40] == 64 and data[i + 46:i + 52] == bytes(6), "layout changed"   # length 64, 8-byte address
    data[i + 50] = 2
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="g.h5: not a readable HDF5 file .*corrupt.*past end"):
        load_graph(path)


def test_graph_path_that_is_a_directory(tmp_path):
    """A directory given as the graph (g3-partition DIR, a partition directory for its graph) ended g3-partition
    with a two-line error, h5py's "file read failed: time = ...<newline>, filename = ..."."""
    from g3mpi.format import load_graph
    with pytest.raises(FormatError) as e:
        load_graph(tmp_path)
    assert str(e.value) == f"{tmp_path}: is a directory, expected a graph file (graph.h5, from g3-prepare)"


def test_graph_unsigned_indptr_that_decreases(tmp_path):
    """A uint64 indptr with a row ending before it starts passed check_csr (np.diff wrapped around), and
    g3-partition and g3-inspect ended with a TypeError traceback (found by fuzzing graph.h5)."""
    from g3mpi.format import load_graph

    def edit(f):
        a = f["indptr"][()]
        i = next(i for i in range(2, len(a) - 1) if a[i] > a[i - 1] > 0)
        a[i] = a[i - 1] - 1
        replace_ds(f, "indptr", a.astype(np.uint64))
    with pytest.raises(FormatError, match="g.h5: graph CSR: indptr is not non-decreasing"):
        load_graph(graph_file(tmp_path, edit))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int16])
def test_graph_indptr_of_another_integer_type_is_read_as_int64(tmp_path, dtype):
    """A uint16/uint32 indptr passed every check, then g3-partition failed with 'IndexError: arrays used as indices
    must be of integer (or boolean) type' (indptr + int64 offsets became float64)."""
    from g3mpi.format import load_graph
    path = graph_file(tmp_path, lambda f: replace_ds(f, "indptr", f["indptr"][()].astype(dtype)))
    g = load_graph(path)
    assert g.indptr.dtype == np.int64
    partition(g, 2, tmp_path / "p2")
    read_part(tmp_path / "p2", 1)


def test_graph_count_beyond_int64(tmp_path):
    from g3mpi.format import load_graph
    path = graph_file(tmp_path, lambda f: f.attrs.__setitem__("num_classes", np.uint64(2**64 - 1)))
    with pytest.raises(FormatError, match=r"g.h5: attribute 'num_classes' must be < 2\*\*63, got 18446744073"):
        load_graph(path)


def test_duplicate_edges_are_in_order(tmp_path):
    """A duplicate edge's copies are adjacent (equal sources): sorted, as FORMAT.md keeps them (they stay)."""
    g = random_graph(n=150, seed=2, multi=True)
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    assert np.any(np.diff(rows * g.num_nodes + g.indices) == 0)   # some row lists a source twice
    partition(g, 2, tmp_path / "p2")
    assert sum(int(read_part(tmp_path / "p2", p).indptr[-1]) for p in (0, 1)) > 0


def test_graph_row_out_of_order(tmp_path):
    """The same in graph.h5 (rows sorted ascending): load_graph refuses it naming the row, and GraphWriter does
    not write it."""
    from g3mpi.format import GraphWriter, load_graph
    g = random_graph(n=40, seed=1)
    r = next(r for r in range(40) if g.indptr[r + 1] - g.indptr[r] > 1)
    a = int(g.indptr[r])

    def edit(f):
        ind = f["indices"][()]
        ind[a], ind[a + 1] = ind[a + 1], ind[a]
        replace_ds(f, "indices", ind)
    with pytest.raises(FormatError, match=rf"g.h5: graph CSR: the sources of row {r} are not in ascending order "
                                          rf"\(node {g.indices[a + 1]} before node {g.indices[a]};"):
        load_graph(graph_file(tmp_path, edit))
    ind = g.indices.copy()
    ind[a], ind[a + 1] = ind[a + 1], ind[a]
    with pytest.raises(FormatError, match=f"h.h5: graph CSR: the sources of row {r} are not in ascending order"):
        with GraphWriter(tmp_path / "h.h5", num_nodes=40, feature_dim=g.features.shape[1], num_classes=3,
                         source="test") as w:
            w.write_csr(g.indptr, ind)
    assert not (tmp_path / "h.h5").exists()


@pytest.mark.parametrize("last", ["num_cols", "-1"])
def test_graph_index_just_outside_the_columns(tmp_path, last):
    """The first index past either end (num_nodes itself, and -1) is refused, not only indices far outside: an
    off-by-one in the bound check would hand torch's CSR kernels a column they read past the end of."""
    from g3mpi.format import load_graph

    def edit(f):
        ind = f["indices"][()]
        n = int(f.attrs["num_nodes"])
        if last == "num_cols":
            ind[-1] = n          # the last row's last source: still in sorted order
        else:
            ind[0] = -1          # the first row's first source: still in sorted order
        replace_ds(f, "indices", ind)
    bad = 40 if last == "num_cols" else -1
    with pytest.raises(FormatError, match=rf"g.h5: graph CSR: column index {bad} out of range \[0, 40\)"):
        load_graph(graph_file(tmp_path, edit))


def test_graph_orig_ids_of_the_wrong_length(tmp_path):
    """orig_ids (one original ID per node) was read without a check of its length."""
    from g3mpi.format import load_graph
    path = graph_file(tmp_path, lambda f: f.create_dataset("orig_ids", data=np.arange(39, dtype=np.int64)))
    with pytest.raises(FormatError, match=r"g.h5: orig_ids has shape \(39,\), expected \(40,\)"):
        load_graph(path)
