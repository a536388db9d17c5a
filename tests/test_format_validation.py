"""Malformed partition files and checkpoints that pass every checksum: each is refused with a FormatError or
CheckpointError naming the file, never a bare TypeError/KeyError from deep inside (found by an audit)."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from tests.graphs import partition, random_graph
from g3mpi.format import FormatError, part_name, read_meta, read_node_map, read_part
from g3mpi.format.checksums import array_sha256, file_sha256
from g3mpi.format.partition import META_NAME, NODE_MAP_NAME, write_meta
from g3mpi.train.checkpoint import CheckpointError, load_checkpoint

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_damaged_attribute_header_in_a_part", "test_damaged_object_header_in_a_part",
              "test_labels_of_another_integer_type_are_read_as_int64", "test_num_edges_against_meta",
              "test_part_file_that_is_a_directory", "test_scalar_list", "test_uint64_beyond_int64",
              "test_unsigned_indptr_that_decreases", "test_unsigned_offsets_are_read_as_int64")


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
    (lambda p: (p.unlink(), p.mkdir()), "cannot be read: Is a directory"),
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
    with pytest.raises(FormatError, match="part-00001.h5: cannot be read: Is a directory"):
        read_part(copy, 1)
    with pytest.raises(FormatError, match="part-00001.h5: not a readable HDF5 file"):
        read_part(copy, 1, verify=False)


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


def _checkpoint(**changes) -> dict:
    model = {"w": torch.zeros(2)}
    c = dict(format="g3mpi-checkpoint", version=1, epoch=3, model=model, optimizer={"state": {}, "param_groups": []},
             rng=torch.get_rng_state(), best=dict(val_acc=0.5, epoch=2, accs={}, state=None), since_best=1,
             last_loss=0.7, config=dict(model="gcn"),
             partition=dict(partition_id="x", num_parts=2, method="metis", files={}))
    c.update(changes)
    return c


def test_checkpoint_good_layout_loads(tmp_path):
    torch.save(_checkpoint(), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["epoch"] == 3
    # the accuracies as make_checkpoint writes them (NaN: a split without nodes)
    accs = dict(train_acc=1.0, val_acc=0.5, test_acc=float("nan"))
    torch.save(_checkpoint(best=dict(val_acc=0.5, epoch=2, accs=accs, state=None)), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["best"]["accs"]["val_acc"] == 0.5


@pytest.mark.parametrize("changes,what", [
    (dict(partition={}), "partition must hold"),
    (dict(config="oops"), "config must be a dict"),
    (dict(epoch="3"), "epoch must be a non-negative integer"),
    (dict(model={"w": 1.0}), "model must map parameter names to tensors"),
    (dict(best=dict(val_acc="x")), "best must hold"),
    (dict(rng=torch.zeros(3)), "rng must be a uint8 tensor"),
    # found by fuzzing checkpoints: 'preparing the run directory failed: TypeError: unsupported operand type(s)
    # for %: 'int' and 'list'', naming the run directory, not the checkpoint
    (dict(config=dict(model="gcn", eval_every=[16])), "config's eval_every must be a positive integer"),
    (dict(config=dict(model="gcn", eval_every=0)), "config's eval_every must be a positive integer"),
    # left open by the fuzzing campaign: accuracies of another type resumed, then the next checkpoint failed to
    # write ('could not convert string to float') or summary.json reported them as they were
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": "0.9"}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": [0.9]}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": True}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"loss": 0.9}, state=None)), "best's accs must map"),
])
def test_checkpoint_layout(tmp_path, changes, what):
    """Files that torch.load(weights_only=True) reads but that would crash the resume with a bare traceback."""
    torch.save(_checkpoint(**changes), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="c.pt: malformed checkpoint: " + what):
        load_checkpoint(tmp_path / "c.pt")


def test_node_map_that_is_a_directory(copy):
    (copy / NODE_MAP_NAME).unlink()
    (copy / NODE_MAP_NAME).mkdir()
    with pytest.raises(FormatError, match="node_map.h5: not a readable HDF5 file"):
        read_node_map(copy)


def test_unsupported_version_is_shown_as_a_number(copy):
    """An HDF5 attribute comes back as a numpy scalar: the message shows 3, not np.int64(3)."""
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", 3))
    with pytest.raises(FormatError, match=r"part-00001.h5: format version 3 is not supported \(reads version 2\)"):
        read_part(copy, 1)


def test_partition_of_version_1_asks_to_partition_again(copy):
    """Version 1 kept owned rows in original order: the boundary-first row groups would be wrong on it."""
    edit_meta(copy, version=1)
    with pytest.raises(FormatError, match="meta.json: format version 1 is not supported .*partition the graph again"):
        read_meta(copy)
    edit_meta(copy, version=2)
    edit_part(copy, 1, lambda f: f.attrs.__setitem__("version", 1))
    with pytest.raises(FormatError, match="part-00001.h5: format version 1 .*before owned rows were boundary-first"):
        read_part(copy, 1)


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


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_checkpoint_version_not_an_integer(tmp_path, value):
    torch.save(_checkpoint(version=value), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="c.pt: checkpoint version .* is not supported"):
        load_checkpoint(tmp_path / "c.pt")


def test_id_checksum_tells_a_partition_of_the_ids_from_one_that_owns_an_id_twice():
    from g3mpi.format.partition import id_checksum, range_checksum
    N = 1000
    perm = np.random.default_rng(0).permutation(N)
    whole = range_checksum(0, N)
    assert whole == id_checksum(np.arange(N)) == range_checksum(0, N, block=7)
    for cuts in ([0, N], [0, 1, 500, N], [0, 0, 333, 999, N]):    # any split of any order, empty parts too
        parts = [np.sort(perm[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
        assert sum(id_checksum(p) for p in parts) % 2**64 == whole
        shares = [range_checksum(r * N // (len(cuts) - 1), (r + 1) * N // (len(cuts) - 1)) for r in range(len(cuts) - 1)]
        assert sum(shares) % 2**64 == whole
    twice = np.concatenate([np.arange(N - 1), [0]])                # 0 owned twice, N - 1 by nobody
    assert id_checksum(twice) != whole
    assert 0 <= whole < 2**64 and id_checksum([]) == 0


# Found by random corruption of part files read with verify=False (g3-train --no-verify): the structural checks
# alone must refuse them with a FormatError naming the file, or read them as the format's types.

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


def damage_attribute(path, name: bytes) -> None:
    """Overwrite 4 bytes of the datatype message of attribute ``name`` (right after its name in the object
    header): h5py then raises RuntimeError ("Can't synchronously determine if attribute exists by name
    (... possibly corrupted file ...)"), not OSError, when the attribute is looked up."""
    data = bytearray(path.read_bytes())
    i = data.index(name + b"\0") + len(name) + 8
    data[i:i + 4] = b"\xff" * 4
    path.write_bytes(bytes(data))


def test_damaged_attribute_header_in_a_part(copy):
    """A damaged attribute message (random bytes in the file, read with --no-verify): h5py's RuntimeError escaped
    read_part, so g3-train's line said 'RuntimeError: ...' without the file's name."""
    damage_attribute(copy / part_name(1), b"num_classes")
    with pytest.raises(FormatError, match="part-00001.h5: not a readable HDF5 file .*corrupt"):
        read_part(copy, 1, verify=False)


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


def _graph_file(tmp_path, edit):
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
        load_graph(_graph_file(tmp_path, edit))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int16])
def test_graph_indptr_of_another_integer_type_is_read_as_int64(tmp_path, dtype):
    """A uint16/uint32 indptr passed every check, then g3-partition failed with 'IndexError: arrays used as indices
    must be of integer (or boolean) type' (indptr + int64 offsets became float64)."""
    from g3mpi.format import load_graph
    path = _graph_file(tmp_path, lambda f: replace_ds(f, "indptr", f["indptr"][()].astype(dtype)))
    g = load_graph(path)
    assert g.indptr.dtype == np.int64
    partition(g, 2, tmp_path / "p2")
    read_part(tmp_path / "p2", 1)


def test_graph_count_beyond_int64(tmp_path):
    from g3mpi.format import load_graph
    path = _graph_file(tmp_path, lambda f: f.attrs.__setitem__("num_classes", np.uint64(2**64 - 1)))
    with pytest.raises(FormatError, match=r"g.h5: attribute 'num_classes' must be < 2\*\*63, got 18446744073"):
        load_graph(path)


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
        load_graph(_graph_file(tmp_path, edit))
    ind = g.indices.copy()
    ind[a], ind[a + 1] = ind[a + 1], ind[a]
    with pytest.raises(FormatError, match=f"h.h5: graph CSR: the sources of row {r} are not in ascending order"):
        with GraphWriter(tmp_path / "h.h5", num_nodes=40, feature_dim=g.features.shape[1], num_classes=3,
                         source="test") as w:
            w.write_csr(g.indptr, ind)
    assert not (tmp_path / "h.h5").exists()


@pytest.mark.parametrize("value,warned", [(3e38, True), (-1e20, True), (1e18, False)])
def test_features_too_large_for_float32_training(copy, caplog, value, warned):
    """Finite features beyond 2^64 (1.8e19) pass as valid, with a warning naming the file and the node: training on
    them overflows float32 (left open by the fuzzing campaign: 3e38 ended the run with a non-finite loss naming no
    file; 1e25 froze parameters through infinite Adam moments and exited 0)."""
    def edit(f):
        x = f["features"][()]
        x[3, 2] = value
        replace_ds(f, "features", x)
    edit_part(copy, 1, edit)
    with caplog.at_level("WARNING", logger="g3mpi.format"):
        part = read_part(copy, 1)
    assert part.features[3, 2] == np.float32(value)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warned:
        assert len(said) == 1 and said[0].startswith(f"{copy / part_name(1)}: the features of 1 node(s) reach "
                                                     f"{abs(np.float32(value)):.3g} in magnitude (the first: node "
                                                     f"{part.owned_start + 3}, original ID {part.orig_ids[3]})"), said
    else:
        assert said == []


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
        load_graph(_graph_file(tmp_path, edit))


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


def large_features_warning(path, nodes: int, peak: float, first: int, orig: int | None = None) -> str:
    """The one line every reader and writer of features logs for values beyond 2^64 (g3mpi.format.LargeFeatures)."""
    return (f"{path}: the features of {nodes} node(s) reach {peak:.3g} in magnitude (the first: node {first}"
            + ("" if orig is None else f", original ID {orig}") + "), beyond 2^64 = 1.8e19, whose square float32 "
            "cannot hold: float32 training on them is likely to overflow (g3-train stops if the summed gradients "
            "pass 2^64); scale them, or replace such values (a fill value for missing data?)")


def warnings_in(caplog) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    caplog.clear()
    return said


@pytest.mark.parametrize("with_orig_ids", [False, True])
def test_graph_features_too_large_for_float32_training(tmp_path, caplog, monkeypatch, with_orig_ids):
    """Finite features beyond 2^64 were warned about by read_part only: the graph's writer (g3-prepare), load_graph
    and the streaming check (g3-inspect) said nothing. Each now logs the same line once, naming the file, the count
    and the first node, also when the rows lie in different blocks (blocks of 4 rows here)."""
    from g3mpi.format import GraphWriter, load_graph
    from g3mpi.format import graph as graph_module
    from g3mpi.format.graph import check_features
    g = random_graph(n=40, seed=1)
    x = g.features.copy()
    x[9, 1], x[9, 4], x[30, 0], x[31, 5] = -2e20, 5e30, 1e19, 3e25   # 1e19 < 2^64: not counted
    orig = np.arange(40, dtype=np.int64) * 3 + 1000 if with_orig_ids else None
    path = tmp_path / "g.h5"
    want = [large_features_warning(path, 2, np.float32(5e30), 9, None if orig is None else 1027)]
    with caplog.at_level("WARNING", logger="g3mpi.format"):
        with GraphWriter(path, num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="test") as w:
            w.write_csr(g.indptr, g.indices)
            for s in range(0, 40, 4):
                w.write_features(s, x[s:s + 4])
            assert warnings_in(caplog) == []   # not before the file is written
            w.write_nodes(g.labels, g.train_mask, g.val_mask, g.test_mask, orig)
        assert warnings_in(caplog) == want
        np.testing.assert_array_equal(load_graph(path).features, x)
        assert warnings_in(caplog) == want
        assert load_graph(path, features=False).features is None and warnings_in(caplog) == []
        monkeypatch.setattr(graph_module, "STREAM_BYTES", 4 * x.shape[1] * 4)
        with h5py.File(path) as f:
            check_features(path, f["features"], orig)
        assert warnings_in(caplog) == want
        x[[9, 31]] = 1e18
        with GraphWriter(tmp_path / "h.h5", num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="t") as w:
            w.write_csr(g.indptr, g.indices)
            w.write_features(0, x)
            w.write_nodes(g.labels, g.train_mask, g.val_mask, g.test_mask, orig)
        assert warnings_in(caplog) == []


def test_graph_features_not_finite_refused_by_load_graph(tmp_path):
    """load_graph read the features without checking them: NaN passed (g3-partition and g3-inspect, which read
    them themselves, refused them); now they are refused naming the node, unless the features are left in the
    file."""
    from g3mpi.format import load_graph

    def edit(f):
        x = f["features"][()]
        x[17, 2] = np.nan
        replace_ds(f, "features", x)
    path = _graph_file(tmp_path, edit)
    with pytest.raises(FormatError, match=r"g.h5: features of node 17 are not finite as float32"):
        load_graph(path)
    assert load_graph(path, features=False).features is None


def test_features_not_finite_one_message_everywhere(copy, tmp_path):
    """Every reader and writer of features refuses a value that is not finite as float32 with one message naming
    the file, the node (an input file's row), the column and the value as stored. Before: three wordings, and
    four checks, by g3-prepare's writer ("features contain NaN or Inf (first at row 13)"), its importers
    ("features contain NaN or Inf (first at row 13, column 2)", "feature 1e+300 at row 13, column 2 does not fit
    in float32"), load_graph and g3-partition ("features of node 17 are not finite as float32 (NaN, Inf or beyond
    float32's range)", the value not shown), a part file's reader ("features contain NaN or Inf", no node)."""
    from data_tools.build import feature_rows
    from data_tools.importers.common import check_features as check_input_features
    from g3mpi.format import GraphWriter, load_graph
    from g3mpi.format.limits import LargeFeatures
    from g3mpi.format.graph import check_features
    why = "NaN, Inf or beyond float32's range)"
    g = random_graph(n=40, seed=1)
    x = g.features.astype(np.float64)
    x[13, 2] = 1e300
    path = tmp_path / "w.h5"
    with pytest.raises(FormatError) as e:     # g3-prepare's writer, given float64 blocks
        with GraphWriter(path, num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="test") as w:
            w.write_csr(g.indptr, g.indices)
            w.write_features(0, x[:8])
            w.write_features(8, x[8:])
    assert str(e.value) == f"{path}: features of node 13 are not finite as float32 (column 2: 1e+300; {why}"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p2"]
    for bad, shown in ((1e300, "1e+300"), (-np.inf, "-inf"), (np.nan, "nan")):     # g3-prepare's importers
        x[13, 2] = bad
        with pytest.raises(FormatError) as e:
            check_input_features("x.npy", x, 40)
        assert str(e.value) == f"x.npy: features of row 13 are not finite as float32 (column 2: {shown}; {why}"

    def edit(f):
        y = f["features"][()].astype(np.float64)
        y[17, 3] = -1e39
        replace_ds(f, "features", y)
    path = _graph_file(tmp_path, edit)
    want = f"{path}: features of node 17 are not finite as float32 (column 3: -1e+39; {why}"
    with pytest.raises(FormatError) as e:     # load_graph
        load_graph(path)
    assert str(e.value) == want
    with h5py.File(path) as f:
        with pytest.raises(FormatError) as e:     # g3-inspect's streaming check
            check_features(path, f["features"])
        assert str(e.value) == want
        with pytest.raises(FormatError) as e:     # g3-partition's copy into the parts
            feature_rows(path, f["features"], 10, 40, LargeFeatures())
        assert str(e.value) == f"{want}: the runtime would refuse the parts"
    part = read_part(copy, 1)

    def edit_part_features(f):
        y = f["features"][()]
        y[3, 1] = np.nan
        replace_ds(f, "features", y)
    edit_part(copy, 1, edit_part_features)
    with pytest.raises(FormatError) as e:     # a part file's reader (the node by its new global ID)
        read_part(copy, 1)
    assert str(e.value) == (f"{copy / part_name(1)}: features of node {part.owned_start + 3} are not finite as "
                            f"float32 (column 1: nan; {why}")


def test_graph_orig_ids_of_the_wrong_length(tmp_path):
    """orig_ids (one original ID per node) was read without a check of its length."""
    from g3mpi.format import load_graph
    path = _graph_file(tmp_path, lambda f: f.create_dataset("orig_ids", data=np.arange(39, dtype=np.int64)))
    with pytest.raises(FormatError, match=r"g.h5: orig_ids has shape \(39,\), expected \(40,\)"):
        load_graph(path)
