"""g3-prepare npz on bad input: missing, truncated or pickled files, bad keys, IDs, features, labels, masks."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import run_module
from tests.prepare_runs import cora_like, fails, out_dir  # noqa: F401 (out_dir: a fixture)

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_npz_bad_num_classes", "test_npz_feature_rows_not_nodes",
              "test_npz_float_labels_that_are_not_integers", "test_npz_given_an_h5", "test_npz_id_out_of_range",
              "test_npz_labels_out_of_range", "test_npz_missing", "test_npz_missing_key", "test_npz_negative_id",
              "test_npz_nonfinite_features", "test_npz_num_classes_in_range", "test_npz_overlapping_masks",
              "test_npz_pickled_object_array", "test_npz_truncated", "test_num_classes_option_above_nodes",
              "test_numpy_file_of_the_other_kind")


def test_npz_missing(tmp_path, out_dir):
    fails(out_dir, "npz", tmp_path / "nope.npz", path=tmp_path / "nope.npz", words=["no such file"])


def test_npz_truncated(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    fails(out_dir, "npz", f, path=f, words=["truncated or corrupt"])


def test_npz_given_an_h5(tmp_path, out_dir):
    f = tmp_path / "g.h5"
    f.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    fails(out_dir, "npz", f, path=f, words=["not a readable .npz"])


@pytest.mark.parametrize("option,content,says", [
    ("INPUT", "npy", "not a readable .npz archive of a graph: the file is a .npy file (one array)"),
    ("INPUT", "text", "not a readable .npz archive of a graph: the file is neither a .npy file nor an .npz archive "
                      "(text?)"),
    ("INPUT", "empty", "not a readable .npz archive of a graph: the file is empty"),
    ("--features", "npz", "not a readable .npy file of features: the file is an .npz archive (named arrays)"),
    ("--labels", "text", "not a readable .npy file of labels: the file is neither a .npy file nor an .npz archive "
                         "(text?)"),
    ("--node-ids", "npz", "not a readable .npy file of node IDs: the file is an .npz archive (named arrays)"),
    ("--masks", "npy", "not a readable .npz archive of split masks: the file is a .npy file (one array)"),
])
def test_numpy_file_of_the_other_kind(tmp_path, out_dir, option, content, says):
    """A .npy file where an .npz archive belongs (or the reverse) ended in a traceback ("'numpy.ndarray' object does
    not support the context manager protocol", "'NpzFile' object has no attribute 'ndim'"), and a text file was
    said to hold pickled data."""
    f = tmp_path / ("g.npz" if option in ("INPUT", "--masks") else "a.npy")
    if content == "npy":
        with open(f, "wb") as h:
            np.save(h, np.ones((3, 2), dtype=np.float32))
    elif content == "npz":
        with open(f, "wb") as h:
            np.savez(h, x=np.ones((3, 2), dtype=np.float32))
    else:
        f.write_text("" if content == "empty" else "0 1\n1 2\n")
    if option == "INPUT":
        line = fails(out_dir, "npz", f, path=f)
    else:
        (tmp_path / "e.txt").write_text("0 1\n1 2\n")
        y = tmp_path / "y.npy"
        np.save(y, np.array([0, 1, 0]))
        extra = ["--labels", y] if option in ("--node-ids", "--masks") else []
        line = fails(out_dir, "edgelist", tmp_path / "e.txt", option, f, *extra, path=f)
    assert line == f"g3-prepare: error: {f}: {says}"


def test_npz_missing_key(tmp_path, out_dir):
    f = tmp_path / "g.npz"
    np.savez(f, x=np.ones((3, 2)))
    fails(out_dir, "npz", f, path=f, words=["edge_index"])


def test_npz_pickled_object_array(tmp_path, out_dir):
    f = tmp_path / "g.npz"
    np.savez(f, edge_index=np.array([[0], [1]]), x=np.array([None, None], dtype=object))
    fails(out_dir, "npz", f, path=f, words=["'x'"])


def test_npz_id_out_of_range(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz", edge_index=np.array([[0, 1, 6], [1, 2, 0]]))
    fails(out_dir, "npz", f, path=f, words=["6", "out of range [0, 6)", "column 2"])


def test_npz_negative_id(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz", edge_index=np.array([[0, 1], [1, -2]]))
    fails(out_dir, "npz", f, path=f, words=["-2", "out of range"])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_npz_nonfinite_features(tmp_path, out_dir, bad):
    x = np.ones((6, 3), dtype=np.float32)
    x[4, 1] = bad
    f = cora_like(tmp_path / "g.npz", x=x)
    fails(out_dir, "npz", f, path=f, words=[f"features of row 4 are not finite as float32 (column 1: {bad}; "])


@pytest.mark.parametrize("y,says", [
    ([0, 1, np.nan, 0, 1, 2], "label nan (entry 2) is not an integer"),
    ([0, 1, 2, 0.5, 1, 2], "label 0.5 (entry 3) is not an integer"),
    ([0, 1, 2, 0, -np.inf, 2], "label -inf (entry 4) is not an integer"),
])
def test_npz_float_labels_that_are_not_integers(tmp_path, out_dir, y, says):
    """Float labels were refused with 'labels must be integers, got dtype float64', although integral float labels
    are accepted: the message now names the entry that is not an integer (a NaN: -1 marks an unlabelled node)."""
    f = cora_like(tmp_path / "g.npz", y=np.array(y))
    assert fails(out_dir, "npz", f, path=f) == (f"g3-prepare: error: {f}: {says} (labels are classes 0, 1, ...; -1 "
                                                "marks an unlabelled node)")


def test_npz_feature_rows_not_nodes(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz", num_nodes=np.array(7))
    fails(out_dir, "npz", f, path=f, words=["6 rows", "7 nodes"])


def test_npz_labels_out_of_range(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz", y=np.array([0, 1, -3, 0, 1, 2]))
    fails(out_dir, "npz", f, path=f, words=["label -3 out of range"])
    f = cora_like(tmp_path / "g.npz")
    fails(out_dir, "npz", f, "--num-classes", 2, path=f, words=["label 2 out of range [-1, 2)"])


@pytest.mark.parametrize("value,words", [
    (np.array([7, 7]), ["num_classes must be one integer", "[2]"]), (np.array("seven"), ["num_classes must be one"]),
    (9.7, ["num_classes must be one integer", "float64"]), (True, ["num_classes must be one integer", "bool"]),
    (10**12, ["num_classes 1000000000000 out of range [3, 6]"]), (2, ["num_classes 2 out of range [3, 6]"])])
def test_npz_bad_num_classes(tmp_path, out_dir, value, words):
    """The archive's num_classes: [7, 7] gave a traceback, 'seven' a message without the file, 9.7 was truncated
    to 9 and 1e12 accepted (g3-train then sized its output layer by it)."""
    f = cora_like(tmp_path / "g.npz", num_classes=value)
    fails(out_dir, "npz", f, path=f, words=words)


def test_npz_num_classes_in_range(tmp_path, out_dir):
    from g3mpi.format import load_graph
    for value in (3, np.array([6], dtype=np.int32)):
        run_module("data_tools.prepare", "npz", cora_like(tmp_path / "g.npz", num_classes=value), "--out",
                   out_dir / "g.h5", "--force")
        assert load_graph(out_dir / "g.h5").attrs["num_classes"] == int(np.asarray(value).reshape(-1)[0])


def test_num_classes_option_above_nodes(tmp_path, out_dir):
    p = run_module("data_tools.prepare", "npz", cora_like(tmp_path / "g.npz"), "--num-classes", 10**12, "--out",
                   out_dir / "g.h5", check=False)
    assert p.returncode == 2 and p.stderr.startswith("g3-prepare: error: --num-classes 1000000000000 is more"), p.stderr
    assert os.listdir(out_dir) == []


def test_npz_overlapping_masks(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz", val_mask=np.array([0, 1, 1, 1, 0, 0], dtype=bool))
    fails(out_dir, "npz", f, path=f, words=["overlap"])
