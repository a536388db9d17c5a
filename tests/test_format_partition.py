"""Reading a partition directory (g3mpi.format.partition): every damaged or inconsistent part file, node map and
meta.json is refused with one message naming the file."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.part_edits import (copy, damage_attribute, edit_meta, edit_part, parts,  # noqa: F401 (fixtures)
                              replace_ds)
from g3mpi.format import FormatError, part_name, read_meta, read_node_map, read_part
from g3mpi.format.checksums import file_sha256
from g3mpi.format.partition import META_NAME, NODE_MAP_NAME, write_meta
from g3mpi.format.schema import PARTITION_VERSION

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_damaged_attribute_header_in_a_part", "test_damaged_object_header_in_a_part",
              "test_labels_of_another_integer_type_are_read_as_int64", "test_num_edges_against_meta",
              "test_part_file_that_is_a_directory", "test_scalar_list", "test_uint64_beyond_int64",
              "test_unsigned_indptr_that_decreases", "test_unsigned_offsets_are_read_as_int64")


@pytest.mark.parametrize("name", ["recv_parts", "send_parts", "send_rows", "indices"])
def test_two_dimensional_lists(copy, name):
    """A 2-D neighbour list once passed every check (np.diff of it is empty) and deadlocked the halo check."""
    edit_part(copy, 0, lambda f: replace_ds(f, name, f[name][()].reshape(-1, 1)))
    with pytest.raises(FormatError, match=f"part-00000.h5: dataset '{name}' has shape .* one dimension"):
        read_part(copy, 0)


def test_unlabelled_training_node(copy):
    def edit(f):
        labels, train = f["labels"][()], f["train_mask"][()]
        labels[np.flatnonzero(train)[0]] = -1
        replace_ds(f, "labels", labels)
    edit_part(copy, 1, edit)
    with pytest.raises(FormatError, match="part-00001.h5: train_mask contains 1 unlabelled nodes"):
        read_part(copy, 1)


def test_labels_beyond_zero_classes(copy):
    """num_classes = 0 in every file with labelled training nodes: the label check was skipped for 0 classes, and
    the first epoch's cross_entropy failed on every rank with a bare IndexError traceback."""
    edit_part(copy, 0, lambda f: f.attrs.__setitem__("num_classes", 0))
    edit_meta(copy, num_classes=0)
    with pytest.raises(FormatError, match=r"part-00000.h5: labels out of range \[-1, 0\): found"):
        read_part(copy, 0)


def test_original_id_listed_twice(copy):
    """An original node ID owned twice in a part passed, and predictions.h5 silently lost a node's row (written
    rank by rank by original ID: its logits stayed NaN, its pred -1)."""
    def edit(f):
        ids = f["orig_ids"][()]
        ids[1] = ids[0]
        replace_ds(f, "orig_ids", ids)
    edit_part(copy, 1, edit)
    with pytest.raises(FormatError, match="part-00001.h5: original node IDs are not distinct"):
        read_part(copy, 1)


def test_group_instead_of_dataset_and_bad_attribute(copy):
    def group(f):
        del f["labels"]
        f.create_group("labels")
    edit_part(copy, 0, group)
    with pytest.raises(FormatError, match="part-00000.h5: dataset 'labels' is missing"):
        read_part(copy, 0)
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("num_parts", "two"))
    with pytest.raises(FormatError, match="part-00001.h5: attribute 'num_parts' is 'two', expected an integer"):
        read_part(copy, 1)


@pytest.mark.parametrize("changes,what", [
    (dict(offsets=5), "offsets must be a list of integers"),
    (dict(offsets=[0, "60", 120]), "offsets must be a list of integers"),
    (dict(files=["part-00000.h5"]), "files must map file names"),
    (dict(num_parts="2"), "num_parts is '2', expected an integer"),
    (dict(num_nodes=True), "num_nodes is True, expected an integer"),
    (dict(partition_id=7), "partition_id is 7, expected a string"),
])
def test_meta_types(copy, changes, what):
    edit_meta(copy, **changes)
    with pytest.raises(FormatError, match="meta.json: " + what):
        read_meta(copy)


@pytest.mark.parametrize("damage,what", [
    (lambda p: p.write_text("[" * 10**5 + "]" * 10**5), "not valid JSON: maximum recursion depth"),
    (lambda p: (p.unlink(), p.mkdir()), "is a directory, expected a regular"),
], ids=["nested", "directory"])
def test_meta_unreadable(copy, damage, what):
    """Arrays nested too deep (a RecursionError) and a meta.json that is a directory (IsADirectoryError) escaped
    read_meta: g3-train's line then lacked the file's name, or g3-inspect showed a traceback."""
    damage(copy / META_NAME)
    with pytest.raises(FormatError, match="meta.json: " + what):
        read_meta(copy)


def test_part_file_that_is_a_directory(copy):
    """Its checksum (read before the HDF5 checks) raised a bare IsADirectoryError: g3-inspect showed a traceback."""
    (copy / part_name(1)).unlink()
    (copy / part_name(1)).mkdir()
    for verify in (True, False):    # refused before any read, the checksum's included
        with pytest.raises(FormatError, match="part-00001.h5: is a directory, expected a regular part file"):
            read_part(copy, 1, verify=verify)


def test_node_map_damaged(copy):
    path = copy / NODE_MAP_NAME
    with h5py.File(path, "r+") as f:
        f.move("new_to_orig", "renamed")
    edit_meta(copy, files=read_meta(copy)["files"] | {NODE_MAP_NAME: file_sha256(path)})
    with pytest.raises(FormatError, match="node_map.h5: dataset 'new_to_orig' is missing"):
        read_node_map(copy)
    path.write_bytes(path.read_bytes()[:100])
    edit_meta(copy, files=read_meta(copy)["files"] | {NODE_MAP_NAME: file_sha256(path)})
    with pytest.raises(FormatError, match="node_map.h5: not a readable HDF5 file"):
        read_node_map(copy)


def test_node_map_that_is_a_directory(copy):
    (copy / NODE_MAP_NAME).unlink()
    (copy / NODE_MAP_NAME).mkdir()
    with pytest.raises(FormatError, match="node_map.h5: is a directory, expected a regular node map"):
        read_node_map(copy)


def test_unsupported_version_is_shown_as_a_number(copy):
    """An HDF5 attribute comes back as a numpy scalar: the message shows 3, not np.int64(3)."""
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", 5))
    with pytest.raises(FormatError, match=r"part-00001.h5: format version 5 is not supported \(reads versions 3 to "
                                          r"4\)"):
        read_part(copy, 1)


def test_partition_of_version_1_asks_to_partition_again(copy):
    """Version 1 kept owned rows in original order: the boundary-first row groups would be wrong on it."""
    edit_meta(copy, version=1)
    with pytest.raises(FormatError, match="meta.json: format version 1 is not supported .*partition the graph again"):
        read_meta(copy)
    edit_meta(copy, version=2)
    with pytest.raises(FormatError, match="meta.json: format version 2 .*older g3mpi: partition the graph again"):
        read_meta(copy)
    edit_meta(copy, version=PARTITION_VERSION)
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", 1))
    with pytest.raises(FormatError, match="part-00001.h5: format version 1 .*before owned rows were boundary-first"):
        read_part(copy, 1)
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", 2))
    with pytest.raises(FormatError, match="part-00001.h5: format version 2 .*older g3mpi: partition the graph again "
                                          "with g3-partition"):
        read_part(copy, 1)


def test_graph_of_version_1_asks_to_prepare_again(tmp_path):
    """graph.h5 version 1 (features always float32, one label per node) is refused with the command to run."""
    import h5py
    from g3mpi.format import load_graph
    from tests.partition_graphs import random_graph, write
    write(random_graph(n=20, m=40, seed=1), tmp_path / "g.h5")
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        f.attrs["version"] = 1
    with pytest.raises(FormatError, match=r"g.h5: format version 1 is not supported \(reads versions 2 to 3\); written by "
                                          "an older g3mpi: prepare it again with g3-prepare"):
        load_graph(tmp_path / "g.h5")


def test_send_rows_outside_the_boundary_block(copy):
    """A send row past ``num_boundary`` (rows not boundary-first) is refused, naming the file."""
    part = read_part(copy, 1)
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("num_boundary", int(part.send_rows.max())))
    with pytest.raises(FormatError, match="part-00001.h5: send row .* is not in the boundary block"):
        read_part(copy, 1)


@pytest.mark.parametrize("value", ["one", 1.0, np.array([1, 1]), True])
def test_version_not_an_integer(copy, value):
    """A version attribute that is not an integer is refused naming the file (a string once raised a bare
    ValueError from int(), with no file named, in g3-train and g3-inspect; an array, an ambiguous truth value)."""
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", value))
    with pytest.raises(FormatError, match="part-00001.h5: format version .* is not supported"):
        read_part(copy, 1)


@pytest.mark.parametrize("value", ["one", np.array([1, 1])])
def test_node_map_version_not_an_integer(copy, value):
    path = copy / NODE_MAP_NAME
    with h5py.File(path, "r+") as f:
        f.attrs["version"] = value
    meta = read_meta(copy)
    meta["files"][NODE_MAP_NAME] = file_sha256(path)
    write_meta(copy, meta)
    with pytest.raises(FormatError, match="node_map.h5: format .* version"):
        read_node_map(copy)


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_meta_version_not_an_integer(copy, value):
    """meta.json's ``"version": true`` was taken for 1 (True == 1)."""
    edit_meta(copy, version=value)
    with pytest.raises(FormatError, match="meta.json: format version .* is not supported"):
        read_meta(copy)


def test_id_checksum_tells_a_partition_of_the_ids_from_one_that_owns_an_id_twice():
    from g3mpi.format.partition import id_checksum, range_checksum
    N = 1000
    perm = np.random.default_rng(0).permutation(N)
    whole = range_checksum(0, N)
    assert whole == id_checksum(np.arange(N)) == range_checksum(0, N, block=7)
    for cuts in ([0, N], [0, 1, 500, N], [0, 0, 333, 999, N]):    # any split of any order, empty parts too
        parts = [np.sort(perm[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
        assert sum(id_checksum(p) for p in parts) % 2**64 == whole
        k = len(cuts) - 1
        shares = [range_checksum(r * N // k, (r + 1) * N // k) for r in range(k)]
        assert sum(shares) % 2**64 == whole
    twice = np.concatenate([np.arange(N - 1), [0]])                # 0 owned twice, N - 1 by nobody
    assert id_checksum(twice) != whole
    assert 0 <= whole < 2**64 and id_checksum([]) == 0


@pytest.mark.parametrize("name", ["recv_parts", "send_parts", "halo_ids"])
def test_scalar_list(copy, name):
    """A list stored as a scalar dataset (one number, no dimension): len() of it raised a bare TypeError, which
    g3-train reported without the file's name."""
    p = next(p for p in (0, 1) if len(getattr(read_part(copy, p), name)))
    edit_part(copy, p, lambda f: replace_ds(f, name, f[name][()][0]))
    with pytest.raises(FormatError, match=f"{part_name(p)}: dataset '{name}' has shape \\(\\), expected one dimension"):
        read_part(copy, p, verify=False)


def test_unsigned_offsets_are_read_as_int64(copy):
    """recv_offsets stored as uint64 (right values): the halo-owner check's np.repeat raised a bare TypeError
    (uint64 cannot be cast to int64 'safely')."""
    edit_part(copy, 0, lambda f: replace_ds(f, "recv_offsets", f["recv_offsets"][()].astype(np.uint64)))
    part = read_part(copy, 0, verify=False)
    assert part.recv_offsets.dtype == np.int64


def test_unsigned_indptr_that_decreases(copy):
    """indptr and in_degree stored as uint64 with a row whose end is before its start: np.diff wrapped around to a
    huge positive number, so 'indptr is not non-decreasing' never fired and the file was accepted."""
    def edit(f):
        indptr = f["indptr"][()]
        i = next(i for i in range(2, len(indptr) - 1) if indptr[i] > indptr[i - 1] > 0)
        indptr[i] = indptr[i - 1] - 1
        deg = f["in_degree"][()].astype(np.uint64)
        deg[:len(indptr) - 1] = np.diff(indptr.astype(np.uint64))
        replace_ds(f, "indptr", indptr.astype(np.uint64))
        replace_ds(f, "in_degree", deg)
    edit_part(copy, 1, edit)
    with pytest.raises(FormatError, match="part-00001.h5: (local CSR: indptr is not non-decreasing|dataset "
                                          "'in_degree' has a value beyond the int64 range)"):
        read_part(copy, 1, verify=False)


def test_uint64_beyond_int64(copy):
    def edit(f):
        rows = f["send_rows"][()].astype(np.uint64)
        rows[0] = 2**64 - 1
        replace_ds(f, "send_rows", rows)
    edit_part(copy, 0, edit)
    with pytest.raises(FormatError, match="part-00000.h5: dataset 'send_rows' has a value beyond the int64 range"):
        read_part(copy, 0, verify=False)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
def test_labels_of_another_integer_type_are_read_as_int64(copy, dtype):
    """Labels stored as int16 or int32 passed every check and reached cross_entropy, which wants int64 targets:
    the first epoch failed on every rank with a traceback."""
    edit_part(copy, 1, lambda f: replace_ds(f, "labels", f["labels"][()].astype(dtype)))
    assert read_part(copy, 1, verify=False).labels.dtype == np.int64


def test_damaged_attribute_header_in_a_part(copy):
    """A damaged attribute message (random bytes in the file, read with --no-verify): h5py's RuntimeError escaped
    read_part, so g3-train's line said 'RuntimeError: ...' without the file's name."""
    damage_attribute(copy / part_name(1), b"num_classes")
    with pytest.raises(FormatError, match="part-00001.h5: not a readable HDF5 file .*corrupt"):
        read_part(copy, 1, verify=False)


def test_num_edges_against_meta(copy):
    """A part's num_edges attribute was not compared with meta.json's (num_nodes, feature_dim and num_classes
    were): a corrupt value passed with --no-verify and became summary.json's num_edges (found by fuzzing)."""
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("num_edges", 2**63 - 1))
    with pytest.raises(FormatError, match="part-00001.h5: says num_edges = 9223372036854775807, meta.json says"):
        read_part(copy, 1, verify=False)


@pytest.mark.parametrize("error", [KeyError("Unable to synchronously open object (unable to determine object type)"),
                                   ValueError("Insufficient precision in available types to represent (31, 23, 8)"),
                                   TypeError("data type '<i5' not understood")])
def test_damaged_object_header_in_a_part(copy, monkeypatch, error):
    """Random bytes in a part file (--no-verify) made h5py raise KeyError, ValueError or TypeError when a dataset
    was opened or read (1 in 250 byte-flip cases of the fuzzer): read_part let them through, and g3-train's line
    said 'KeyError: ...' without the file's name. (h5py raises them for damaged object headers and type
    messages; the damage itself depends on the file's layout, so the test raises what h5py raised.)"""
    real = h5py.Group.__getitem__

    def damaged(self, name):
        if name == "labels":
            raise error
        return real(self, name)
    monkeypatch.setattr(h5py.Group, "__getitem__", damaged)
    with pytest.raises(FormatError, match="part-00000.h5: not a readable HDF5 file"):
        read_part(copy, 0, verify=False)


def _rows_with(f, want) -> int:
    """The first owned row of an open part file whose local columns satisfy ``want(columns, n_owned, below)``
    (``below``: the number of halo rows with a smaller global ID than the owned ones)."""
    ip, ind = f["indptr"][()], f["indices"][()]
    n, below = len(ip) - 1, int(np.searchsorted(f["halo_ids"][()], f.attrs["owned_start"]))
    return next(r for r in range(n) if want(ind[ip[r]:ip[r + 1]], n, below))


def test_part_row_out_of_order(copy):
    """The sources of a row in another order than FORMAT.md's (sorted by new global ID) passed every check (left
    open by the fuzzing campaign); refused naming the file and the first such row."""
    def edit(f):
        ip, ind = f["indptr"][()], f["indices"][()]
        r = _rows_with(f, lambda c, n, below: len(np.unique(c)) > 1)
        a = int(ip[r])
        b = a + int(np.argmax(ind[a:ip[r + 1]] != ind[a]))   # the first entry unlike the row's first
        ind[a], ind[b] = ind[b], ind[a]
        replace_ds(f, "indices", ind)
        f.attrs["test_row"] = r
    edit_part(copy, 1, edit)
    with h5py.File(copy / part_name(1)) as f:
        r, s = int(f.attrs["test_row"]), int(f.attrs["owned_start"])
    with pytest.raises(FormatError, match=rf"part-00001.h5: local CSR: the sources of owned row {r} \(node {s + r}\) "
                                          r"are not sorted by new global ID \(node \d+ before node \d+;"):
        read_part(copy, 1)


def test_part_row_sorted_by_local_column_is_not_global_order(copy):
    """Local columns put the owned rows before every halo row, global IDs put the halo rows of lower parts first:
    a row with an owned source and one from a lower part, sorted by local column, is out of (global) order."""
    def edit(f):
        ip, ind = f["indptr"][()], f["indices"][()]
        r = _rows_with(f, lambda c, n, below: (c < n).any() and ((c >= n) & (c < n + below)).any())
        ind[ip[r]:ip[r + 1]].sort()
        replace_ds(f, "indices", ind)
    read_part(copy, 1)   # as written: in global order
    edit_part(copy, 1, edit)
    with pytest.raises(FormatError, match="part-00001.h5: local CSR: the sources of owned row .* are not sorted"):
        read_part(copy, 1)


@pytest.mark.parametrize("block", [5, 1 << 16])
def test_row_order_check_agrees_with_its_definition(parts, monkeypatch, block):
    """The check compares local columns with two exceptions (the halo rows of lower parts come first in global
    order) instead of looking every column's global ID up: against that lookup, rows shuffled at random, one or a
    few at a time, are refused exactly when some row is out of global order, naming the first; also when the
    check's blocks of edges are small (pairs of entries across two blocks)."""
    from g3mpi.format import partition as fp
    monkeypatch.setattr(fp, "ORDER_BLOCK", block)
    _check_row_order = fp._check_row_order
    rng = np.random.default_rng(0)
    for p in (0, 1):
        part = read_part(parts, p)
        ip, ind = part.indptr, part.indices.copy()
        gid = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])
        rows = np.repeat(np.arange(part.num_owned), np.diff(ip))
        multi = np.flatnonzero(np.diff(ip) > 1)
        for trial in range(200):
            part.indices = ind.copy()
            for r in rng.choice(multi, 1 + trial % 3):
                part.indices[ip[r]:ip[r + 1]] = rng.permutation(part.indices[ip[r]:ip[r + 1]])
            g = gid[part.indices]
            wrong = np.flatnonzero((g[1:] < g[:-1]) & (rows[1:] == rows[:-1]))
            if len(wrong):
                with pytest.raises(FormatError, match=f"the sources of owned row {rows[wrong[0] + 1]} "):
                    _check_row_order(parts / part_name(p), part)
            else:
                _check_row_order(parts / part_name(p), part)


@pytest.mark.parametrize("last", ["num_cols", "-1"])
def test_part_index_just_outside_the_columns(copy, last):
    """As above for a part's local CSR, whose columns are the owned rows then the halo rows."""
    def edit(f):
        ind = f["indices"][()]
        cols = len(f["indptr"][()]) - 1 + len(f["halo_ids"][()])
        if last == "num_cols":
            ind[-1] = cols
        else:
            ind[0] = -1
        replace_ds(f, "indices", ind)
        f.attrs["test_cols"] = cols
    edit_part(copy, 1, edit)
    with h5py.File(copy / part_name(1)) as f:
        cols = int(f.attrs["test_cols"])
    bad = cols if last == "num_cols" else -1
    with pytest.raises(FormatError, match=rf"part-00001.h5: local CSR: column index {bad} out of range \[0, {cols}\)"):
        read_part(copy, 1)
