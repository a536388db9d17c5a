"""g3-prepare on bad input: one line on stderr naming the file (and the line), non-zero exit, nothing left behind."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import run_module, tool_env

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_bad_option_value_named", "test_bad_split_fractions", "test_disk_full_while_writing",
              "test_edgelist_bad_id_python_would_take", "test_edgelist_empty", "test_edgelist_id_not_in_node_ids",
              "test_edgelist_id_out_of_range_of_features", "test_edgelist_labels_and_masks",
              "test_edgelist_malformed_line", "test_edgelist_malformed_line_far_into_a_gz", "test_edgelist_missing",
              "test_edgelist_nan_features", "test_edgelist_not_text", "test_edgelist_rows_mismatch",
              "test_edgelist_truncated_and_pickled_npy", "test_edgelist_truncated_gz",
              "test_features_too_large_for_float32_warn", "test_float64_features_beyond_float32",
              "test_float_label_beyond_int64", "test_generator_bad_parameters", "test_no_training_nodes_warns",
              "test_npz_bad_num_classes", "test_npz_feature_rows_not_nodes",
              "test_npz_float_labels_that_are_not_integers", "test_npz_given_an_h5", "test_npz_id_out_of_range",
              "test_npz_labels_out_of_range", "test_npz_missing", "test_npz_missing_key", "test_npz_negative_id",
              "test_npz_nonfinite_features", "test_npz_num_classes_in_range", "test_npz_overlapping_masks",
              "test_npz_pickled_object_array", "test_npz_truncated", "test_num_classes_option_above_nodes",
              "test_numpy_file_of_the_other_kind", "test_ogb_bad_files", "test_ogb_duplicate_split_index",
              "test_ogb_edge_count_checked", "test_ogb_label_beyond_int64", "test_ogb_missing",
              "test_ogb_node_count_from_the_labels_is_named", "test_ogb_truncated_gz",
              "test_ogb_unsupported_layouts", "test_output_directory_missing", "test_output_exists_without_force",
              "test_output_is_a_directory", "test_output_is_a_file_of_the_ogb_dataset",
              "test_output_is_an_input_option", "test_output_is_the_input",
              "test_sigterm_lost_in_a_callback_still_stops", "test_summary_into_a_closed_pipe",
              "test_terminated_by_sigterm_leaves_nothing", "test_text_that_is_not_utf8")


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


def fails(out_dir, *args, path, words=(), out_name="g.h5"):
    """Run g3-prepare expecting failure; check the message and that out_dir gained nothing."""
    before = sorted(os.listdir(out_dir))
    p = run_module("data_tools.prepare", *args, "--out", out_dir / out_name, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0, p.stderr
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"g3-prepare: error: {path}"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in p.stderr
    assert sorted(os.listdir(out_dir)) == before, "output or temporary files left behind"
    return lines[0]


def cora_like(path, n=6, **over):
    arrays = dict(edge_index=np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]), x=np.ones((n, 3), dtype=np.float32),
                  y=np.array([0, 1, 2, 0, 1, 2]), train_mask=np.array([1, 1, 0, 0, 0, 0], dtype=bool),
                  val_mask=np.array([0, 0, 1, 1, 0, 0], dtype=bool), test_mask=np.array([0, 0, 0, 0, 1, 1], dtype=bool))
    arrays.update(over)
    np.savez(path, **arrays)
    return path


# ---------------------------------------------------------------------------------------------- npz

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


def test_output_exists_without_force(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz")
    (out_dir / "g.h5").write_bytes(b"precious")
    fails(out_dir, "npz", f, path=out_dir / "g.h5", words=["already exists", "--force"])
    assert (out_dir / "g.h5").read_bytes() == b"precious"


def test_output_is_a_directory(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz")
    (out_dir / "d.h5").mkdir()
    fails(out_dir, "npz", f, "--force", path=out_dir / "d.h5", out_name="d.h5", words=["is a directory"])
    assert (out_dir / "d.h5").is_dir()


def test_edgelist_empty(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("# nothing here\n\n")
    fails(out_dir, "edgelist", f, path=f, words=["no edges"])


def test_output_directory_missing(tmp_path, out_dir):
    f = cora_like(tmp_path / "g.npz")
    fails(out_dir, "npz", f, path=out_dir / "sub" / "g.h5", out_name="sub/g.h5", words=["does not exist"])


def test_bad_split_fractions(tmp_path, out_dir):
    p = run_module("data_tools.prepare", "sbm", "--nodes", 10, "--train", 0.9, "--val", 0.5, "--out",
                   out_dir / "g.h5", check=False)
    assert p.returncode != 0 and p.stderr.strip().splitlines() == [
        "g3-prepare: error: --train and --val must be fractions with train + val <= 1 (got 0.9, 0.5)"]
    assert os.listdir(out_dir) == []


def test_generator_bad_parameters(out_dir):
    for args in (["sbm", "--nodes", 5, "--classes", 9], ["sbm", "--p-in", 0.1], ["rmat", "--scale", 0]):
        p = run_module("data_tools.prepare", *args, "--out", out_dir / "g.h5", check=False)
        assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert p.stderr.startswith("g3-prepare: error: ")
    assert os.listdir(out_dir) == []


@pytest.mark.parametrize("args,option", [
    (["sbm", "--nodes", 30, "--seed", -1], "--seed"), (["rmat", "--scale", 4, "--seed", -1], "--seed"),
    (["edgelist", "e.txt", "--seed", -1], "--seed"), (["npz", "g.npz", "--seed", -1], "--seed"),
    (["sbm", "--nodes", 30, "--avg-degree", "nan"], "--avg-degree"),
    (["sbm", "--nodes", 30, "--noise", "nan"], "--noise"),
    (["rmat", "--scale", 4, "--noise", "nan"], "--noise"),
    (["npz", "g.npz", "--num-classes", -1], "--num-classes"), (["npz", "g.npz", "--num-classes", 0], "--num-classes"),
    (["ogb", "d", "--num-classes", 0], "--num-classes"), (["edgelist", "e.txt", "--num-classes", 2], "--num-classes")])
def test_bad_option_value_named(out_dir, args, option):
    """A bad seed said only 'expected non-negative integer'; a NaN --avg-degree 'cannot convert float NaN to
    integer'; a NaN --noise blamed the output's features; --num-classes -1 or 0 was reported as a label out of
    range in the input file ('label 1 out of range [-1, -1) (--num-classes -1)', exit 1), and --num-classes without
    --labels was ignored."""
    p = run_module("data_tools.prepare", *args, "--out", out_dir / "g.h5", check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"g3-prepare: error: {option} "), p.stderr
    assert os.listdir(out_dir) == []


# ---------------------------------------------------------------------------------------------- edgelist

def test_edgelist_missing(tmp_path, out_dir):
    fails(out_dir, "edgelist", tmp_path / "e.txt", path=tmp_path / "e.txt", words=["no such file"])


@pytest.mark.parametrize("text,line,words", [
    ("# c\n1 2\n3 4\nfive 6\n", 4, ["column 1", "'five'"]),
    ("1,2\n\n% c\n3\n", 4, ["at least 2 columns, found 1"]),
    ("1\t2\n3\t4.5\n", 2, ["column 2", "'4.5'"]),
    ("1 2\n3 99999999999999999999999\n", 2, ["column 2"]),
])
def test_edgelist_malformed_line(tmp_path, out_dir, text, line, words):
    f = tmp_path / "e.txt"
    f.write_text(text)
    fails(out_dir, "edgelist", f, path=f, words=[f"line {line}:", *words])


def test_edgelist_malformed_line_far_into_a_gz(tmp_path, out_dir, monkeypatch):
    f = tmp_path / "e.csv.gz"
    lines = [f"{i},{i + 1}" for i in range(5000)]
    lines[4321] = "4321;4322"
    with gzip.open(f, "wt") as g:
        g.write("src,dst\n" + "\n".join(lines) + "\n")
    fails(out_dir, "edgelist", f, path=f, words=["line 4323:"])


def test_edgelist_truncated_gz(tmp_path, out_dir):
    f = tmp_path / "e.txt.gz"
    with gzip.open(f, "wt") as g:
        g.write("".join(f"{i} {i + 1}\n" for i in range(20000)))
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    fails(out_dir, "edgelist", f, path=f, words=["truncated or corrupt"])


def test_edgelist_id_out_of_range_of_features(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n# c\n1 2\n2 3\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), dtype=np.float32))
    fails(out_dir, "edgelist", f, "--features", tmp_path / "x.npy", path=f,
          words=["line 4:", "node ID 3 out of range [0, 3)"])


def test_edgelist_id_not_in_node_ids(tmp_path, out_dir):
    f = tmp_path / "e.csv"
    f.write_text("id1,id2\n10,20\n20,30\n")
    np.save(tmp_path / "x.npy", np.ones((2, 2), dtype=np.float32))
    np.save(tmp_path / "ids.npy", np.array([10, 20]))
    fails(out_dir, "edgelist", f, "--features", tmp_path / "x.npy", "--node-ids", tmp_path / "ids.npy", path=f,
          words=["line 3:", "node ID 30 is not in"])


def test_edgelist_nan_features(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n")
    x = np.ones((2, 2), dtype=np.float32)
    x[1, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    fails(out_dir, "edgelist", f, "--features", tmp_path / "x.npy", path=tmp_path / "x.npy",
          words=["features of row 1 are not finite as float32 (column 0: nan; "])


def test_edgelist_truncated_and_pickled_npy(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n")
    x = tmp_path / "x.npy"
    np.save(x, np.ones((200, 8), dtype=np.float32))
    x.write_bytes(x.read_bytes()[:1000])
    fails(out_dir, "edgelist", f, "--features", x, path=x, words=["not a readable .npy"])
    np.save(x, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    fails(out_dir, "edgelist", f, "--features", x, path=x, words=["pickled"])


def test_edgelist_rows_mismatch(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    fails(out_dir, "edgelist", f, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
          path=tmp_path / "y.npy", words=["2 rows", "features have 3"])


def test_edgelist_labels_and_masks(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n")
    y = tmp_path / "y.npy"
    np.save(y, np.array([0, 7, 1]))
    fails(out_dir, "edgelist", f, "--labels", y, "--num-classes", 3, path=y, words=["label 7 out of range"])
    np.save(y, np.array([0, 1, 1]))
    m = tmp_path / "m.npz"
    np.savez(m, train_mask=np.array([1, 1, 0], bool), val_mask=np.array([0, 1, 0], bool),
             test_mask=np.array([0, 0, 1], bool))
    fails(out_dir, "edgelist", f, "--labels", y, "--masks", m, path=m, words=["overlap"])


def test_float64_features_beyond_float32(tmp_path, out_dir):
    """float64 features too large for float32 (1e39) became Inf in the cast: a RuntimeWarning on stderr and an
    error naming the output file instead of the input."""
    f = cora_like(tmp_path / "g.npz", x=np.array([[1.0], [2.0], [1e39], [0.0], [1.0], [1.0]]))
    fails(out_dir, "npz", f, path=f, words=["features of row 2 are not finite as float32 (column 0: 1e+39; "])
    (tmp_path / "e.txt").write_text("0 1\n1 2\n")
    x = tmp_path / "x.npy"
    np.save(x, np.array([[1.0, -3e40], [0.0, 0.0], [1.0, 1.0]]))
    fails(out_dir, "edgelist", tmp_path / "e.txt", "--features", x, path=x,
          words=["features of row 0 are not finite as float32 (column 1: -3e+40; "])


def test_edgelist_bad_id_python_would_take(tmp_path, out_dir):
    """np.loadtxt refuses '1_000' and non-ASCII digits, Python's int() takes them: the line-by-line explanation found
    nothing and the message was 'lines 1-3: cannot parse: ...' (numpy's 0-based row) instead of the line."""
    f = tmp_path / "e.txt"
    f.write_text("1 2\n1_000 2\n3 4\n")
    fails(out_dir, "edgelist", f, path=f, words=["line 2: column 1: cannot parse '1_000' as an integer"])
    f.write_text("1 2\n3 4\n5 \u0663\n", encoding="utf-8")
    fails(out_dir, "edgelist", f, path=f, words=["line 3: column 2: cannot parse '\u0663' as an integer"])


def test_edgelist_not_text(tmp_path, out_dir):
    """A bzip2 / xz / zip / .npy file given as an edge list was parsed as text: 'no edges found' (its binary first
    line taken for a header) or a parse error on line 2 or 3."""
    import bz2
    import lzma
    text = b"1 2\n2 3\n"
    for name, data, words in [("e.txt.bz2", bz2.compress(text), ["is bzip2-compressed", "decompress it first"]),
                              ("e.txt.xz", lzma.compress(text), ["is xz-compressed"]),
                              ("e.npy", None, ["is a NumPy .npy file, not text"])]:
        f = tmp_path / name
        if data is None:
            np.save(f, np.array([[1, 2], [2, 3]]))
        else:
            f.write_bytes(data)
        fails(out_dir, "edgelist", f, path=f, words=words)


@pytest.mark.parametrize("encoding,says", [
    ("utf-16", "UTF-16 text: only UTF-8 (or ASCII) text is read, convert it first (iconv -f UTF-16 -t UTF-8)"),
    ("utf-32", "UTF-32 text: only UTF-8 (or ASCII) text is read, convert it first (iconv -f UTF-32 -t UTF-8)"),
    ("utf-16-le", "not UTF-8 text{}: a NUL byte at offset 1 (UTF-16 without a byte-order mark? a binary file?)"),
])
@pytest.mark.parametrize("gzipped", [False, True])
def test_text_that_is_not_utf8(tmp_path, out_dir, encoding, says, gzipped):
    """UTF-16 text (as Windows PowerShell 5 writes by default) was read as UTF-8: its first line became a header
    and the second failed with "column 1: cannot parse '\\x002\\x00' as an integer", or, from an OGB file, "line
    1: ... cannot parse '��0\\x00'". Now named, with or without a byte-order mark, also inside a gzip file."""
    text = "1 2\r\n2 3\r\n".encode(encoding)
    f = tmp_path / ("e.txt.gz" if gzipped else "e.txt")
    f.write_bytes(gzip.compress(text) if gzipped else text)
    what = says.format(" once decompressed" if gzipped else "")
    verb = "" if what.startswith("not") else "holds " if gzipped else "is "
    assert fails(out_dir, "edgelist", f, path=f) == f"g3-prepare: error: {f}: {verb}{what}"
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "edge.csv").write_bytes("0,1\n1,2\n".encode(encoding))
    g = root / "raw" / "edge.csv"
    assert fails(out_dir, "ogb", root, path=g) == f"g3-prepare: error: {g}: {'' if verb == '' else 'is '}" + \
        says.format("")


def test_float_label_beyond_int64(tmp_path, out_dir):
    """Integer-valued float labels are accepted; one of 1e30 wrapped in the cast to int64 (a RuntimeWarning and an
    error naming the output file with 'found -9223372036854775808..1')."""
    f = cora_like(tmp_path / "g.npz", y=np.array([0.0, 1.0, 1e30, 0.0, 1.0, 2.0]))
    fails(out_dir, "npz", f, path=f, words=["label 1e+30 (entry 2) out of range"])
    (tmp_path / "e.txt").write_text("0 1\n1 2\n")
    y = tmp_path / "y.npy"
    np.save(y, np.array([0.0, -1e20, 1.0]))
    fails(out_dir, "edgelist", tmp_path / "e.txt", "--labels", y, path=y, words=["label -1e+20 (entry 1)"])


# ---------------------------------------------------------------------------------------------- ogb

def make_ogb(root):
    (root / "raw").mkdir(parents=True)
    (root / "split" / "s").mkdir(parents=True)
    files = {"raw/edge.csv": "0,1\n1,2\n2,3\n", "raw/node-feat.csv": "1,2\n3,4\n5,6\n7,8\n",
             "raw/node-label.csv": "0\n1\n1\n0\n", "raw/num-node-list.csv": "4\n",
             "split/s/train.csv": "0\n1\n", "split/s/valid.csv": "2\n", "split/s/test.csv": "3\n"}
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_ogb_missing(tmp_path, out_dir):
    fails(out_dir, "ogb", tmp_path / "nope", path=tmp_path / "nope", words=["no such directory"])
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "node-feat.csv").unlink()
    fails(out_dir, "ogb", root, path=root / "raw" / "node-feat.csv.gz", words=["no such file"])


def test_ogb_bad_files(tmp_path, out_dir):
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "node-feat.csv").write_text("1,2\n3,4\n5\n7,8\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-feat.csv", words=["line 3:"])
    (root / "raw" / "node-feat.csv").write_text("1,2\n3,4\n5,6\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-feat.csv", words=["3 rows", "4 nodes"])
    (root / "raw" / "node-feat.csv").write_text("1,2\n3,4\n5,6\n7,8\n9,10\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-feat.csv", words=["more than 4 rows"])
    (root / "raw" / "node-feat.csv").write_text("1,2\n3,4\n5,6\n7,inf\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-feat.csv",
          words=["features of row 3 (line 4) are not finite as float32 (column 1: inf; "])
    (root / "raw" / "node-feat.csv").write_text("1,2\n3,4\n5,6\n7,8\n")
    (root / "raw" / "edge.csv").write_text("0,1\n1,4\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "edge.csv", words=["line 2:", "node ID 4 out of range"])
    (root / "raw" / "edge.csv").write_text("0,1\n")
    (root / "raw" / "node-label.csv").write_text("0\n1\n-2\n0\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-label.csv", words=["line 3:", "label -2"])
    (root / "raw" / "node-label.csv").write_text("0\n1\n1\n0\n")
    (root / "split" / "s" / "valid.csv").write_text("1\n")
    fails(out_dir, "ogb", root, path=root / "split" / "s", words=["overlap"])
    (root / "split" / "s" / "valid.csv").write_text("9\n")
    fails(out_dir, "ogb", root, path=root / "split" / "s" / "valid.csv", words=["line 1:", "out of range"])
    fails(out_dir, "ogb", root, "--split", "other", path=root / "split" / "other", words=["available: s"])


def test_ogb_node_count_from_the_labels_is_named(tmp_path, out_dir):
    """Without num-node-list.csv the node count is the number of lines of node-label.csv: a label file cut short
    was reported as an edge, feature row or split index out of range in another file, with no word of node-label."""
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "num-node-list.csv").unlink()
    (root / "raw" / "node-label.csv").write_text("0\n1\n1\n")
    why = " (3 nodes: the lines of node-label.csv, as there is no num-node-list)"
    edge, feat, test = root / "raw" / "edge.csv", root / "raw" / "node-feat.csv", root / "split" / "s" / "test.csv"
    assert fails(out_dir, "ogb", root, path=edge) == \
        f"g3-prepare: error: {edge}: line 3: node ID 3 out of range [0, 3){why}"
    edge.write_text("0,1\n1,2\n")
    assert fails(out_dir, "ogb", root, path=test) == \
        f"g3-prepare: error: {test}: line 1: node index 3 out of range [0, 3){why}"
    test.write_text("2\n")
    (root / "split" / "s" / "valid.csv").write_text("")
    assert fails(out_dir, "ogb", root, path=feat) == \
        f"g3-prepare: error: {feat}: more than 3 rows: the graph has 3 nodes{why}"
    feat.write_text("1,2\n3,4\n")
    assert fails(out_dir, "ogb", root, path=feat) == \
        f"g3-prepare: error: {feat}: features have 2 rows but the graph has 3 nodes{why}"
    (root / "raw" / "num-node-list.csv").write_text("3\n")
    assert fails(out_dir, "ogb", root, path=feat) == \
        f"g3-prepare: error: {feat}: features have 2 rows but the graph has 3 nodes"


def test_ogb_duplicate_split_index(tmp_path, out_dir):
    """A node listed twice in a split file was folded into the mask silently (a corrupt or concatenated split)."""
    root = make_ogb(tmp_path / "d")
    (root / "split" / "s" / "train.csv").write_text("0\n1\n0\n")
    fails(out_dir, "ogb", root, path=root / "split" / "s" / "train.csv",
          words=["line 3:", "node index 0 listed twice", "line 1"])


def test_ogb_unsupported_layouts(tmp_path, out_dir):
    """ogbn-proteins (112 label columns, no node-feat), ogbn-mag (raw/relations/) and ogbn-papers100M (raw/data.npz)
    are named as unsupported; before, each failed with 'node-feat.csv.gz' or 'edge.csv.gz: no such file'."""
    root = make_ogb(tmp_path / "proteins")
    (root / "raw" / "node-feat.csv").unlink()
    (root / "raw" / "node-label.csv").write_text("".join(",".join("01"[(i + j) % 2] for j in range(112)) + "\n"
                                                         for i in range(4)))
    fails(out_dir, "ogb", root, path=root / "raw" / "node-label.csv", words=["112 label columns", "multi-label"])
    mag = tmp_path / "mag" / "raw"
    (mag / "relations" / "paper___cites___paper").mkdir(parents=True)
    with gzip.open(mag / "num-node-dict.csv.gz", "wt") as g:
        g.write("author,paper\n2,3\n")
    fails(out_dir, "ogb", mag.parent, path=mag, words=["heterogeneous", "ogbn-mag"])
    papers = tmp_path / "papers" / "raw"
    papers.mkdir(parents=True)
    np.savez_compressed(papers / "data.npz", edge_index=np.array([[0], [1]]), node_feat=np.ones((2, 2)),
                        num_nodes_list=np.array([2]), num_edges_list=np.array([1]))
    fails(out_dir, "ogb", papers.parent, path=papers / "data.npz", words=["binary layout", "not supported"])


def test_ogb_edge_count_checked(tmp_path, out_dir):
    """An uncompressed edge.csv cut short at a line end (an interrupted copy) was imported with the edges it had,
    although num-edge-list.csv gives the count."""
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "num-edge-list.csv").write_text("3\n")
    (root / "raw" / "edge.csv").write_text("0,1\n1,2\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "edge.csv",
          words=["2 edges but num-edge-list.csv says 3"])
    (root / "raw" / "num-edge-list.csv").write_text("3\n4\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "num-edge-list.csv", words=["one graph's edge count"])


def test_ogb_label_beyond_int64(tmp_path, out_dir):
    """A label 1e30 wrapped in the cast to int64: a RuntimeWarning (2 more stderr lines) and 'label
    -9223372036854775808 out of range'."""
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "node-label.csv").write_text("0\n1\n1e30\n0\n")
    fails(out_dir, "ogb", root, path=root / "raw" / "node-label.csv", words=["line 3: label 1e+30 out of range"])


def test_ogb_truncated_gz(tmp_path, out_dir):
    root = make_ogb(tmp_path / "d")
    (root / "raw" / "edge.csv").unlink()
    gz = root / "raw" / "edge.csv.gz"
    with gzip.open(gz, "wt") as g:
        g.write("".join(f"{i % 4},{(i + 1) % 4}\n" for i in range(30000)))
    gz.write_bytes(gz.read_bytes()[:-30])
    fails(out_dir, "ogb", root, path=gz, words=["truncated or corrupt"])


def test_output_is_the_input(tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    f = cora_like(d / "in.npz")
    fails(d, "npz", f, "--force", path=f, out_name="in.npz", words=["overwrite the input"])
    np.load(f)["x"]                                   # still intact


def test_output_is_an_input_option(tmp_path):
    """--out naming --features (or a link to the input) was replaced with --force."""
    d = tmp_path / "o"
    d.mkdir()
    (d / "e.txt").write_text("0 1\n1 2\n")
    x = d / "x.npy"
    np.save(x, np.ones((3, 2), dtype=np.float32))
    fails(d, "edgelist", d / "e.txt", "--features", x, "--force", path=x, out_name="x.npy",
          words=["overwrite the input (--features)"])
    (d / "link.txt").symlink_to(d / "e.txt")
    fails(d, "edgelist", d / "link.txt", "--force", path=d / "e.txt", out_name="e.txt", words=["overwrite the input"])
    assert np.load(x).shape == (3, 2) and (d / "e.txt").read_text() == "0 1\n1 2\n"


def test_output_is_a_file_of_the_ogb_dataset(tmp_path):
    """--out naming one of the OGB dataset's files (the input is the directory) replaced it with --force."""
    root = make_ogb(tmp_path / "d")
    label = root / "raw" / "node-label.csv"
    fails(root / "raw", "ogb", root, "--force", path=label, out_name="node-label.csv",
          words=["overwrite the input", str(label)])
    assert label.read_text() == "0\n1\n1\n0\n"


def test_late_writer_failure_leaves_nothing(tmp_path):
    """A failure after graph.h5 was opened (a bad feature block from a generator) removes the temp file."""
    from data_tools.importers.common import PrepareOptions, RawGraph, write_raw_graph
    from g3mpi.format import FormatError

    def blocks():
        yield 0, np.ones((2, 3), dtype=np.float32)
        yield 2, np.full((2, 3), np.nan, dtype=np.float32)
    raw = RawGraph(path="gen", num_nodes=4, src=np.array([0, 1]), dst=np.array([1, 2]), feature_dim=3,
                   feature_blocks=blocks, labels=np.array([0, 1, 0, 1]), num_classes=2)
    with pytest.raises(FormatError, match=r"g\.h5: features of node 2 are not finite as float32 \(column 0: nan; "):
        write_raw_graph(tmp_path / "g.h5", raw, PrepareOptions(quiet=True))
    assert os.listdir(tmp_path) == []


def test_no_training_nodes_warns(tmp_path, out_dir):
    """An edge list without labels gives a graph g3-train refuses: g3-prepare and g3-partition say so (one warning
    line each, exit 0: such graphs serve partitioning benchmarks); before they were silent."""
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 3\n3 0\n")
    p = run_module("data_tools.prepare", "edgelist", f, "--out", out_dir / "g.h5", "--quiet")
    assert p.stderr.strip().splitlines() == [f"g3-prepare: warning: {out_dir / 'g.h5'}: no training nodes (no labels, "
                                             f"or an empty train split): g3-train will refuse this graph"]
    p = run_module("data_tools.partition", out_dir / "g.h5", "--parts", 2, "--out", out_dir / "parts", "--no-progress")
    warnings = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert warnings == [f"g3-partition: warning: {out_dir / 'g.h5'}: no training nodes (no labels, or an empty train "
                        f"mask): g3-train will refuse this partition"]
    p = run_module("data_tools.prepare", "sbm", "--nodes", 50, "--classes", 2, "--out", out_dir / "s.h5", "--quiet")
    assert p.stderr == ""


def test_features_too_large_for_float32_warn(tmp_path, out_dir):
    """Finite features beyond 2^64 (too large for float32 training) were named only when g3-train read the parts:
    g3-prepare, g3-partition and g3-inspect said nothing. Each now warns in one line naming the graph file, the
    number of such nodes and the first (exit 0: such values are valid); not after --normalize-features."""
    x = np.ones((6, 3), dtype=np.float32)
    x[2, 1], x[4, 0], x[5, 2] = 4e20, -3e38, 1e19
    npz = cora_like(tmp_path / "big.npz", x=x)
    out = out_dir / "g.h5"
    said = (f"warning: {out}: the features of 2 node(s) reach 3e+38 in magnitude (the first: node 2), beyond 2^64 = "
            "1.8e19, whose square float32 cannot hold: float32 training on them is likely to overflow (g3-train stops "
            "if the summed gradients pass 2^64); scale them, or replace such values (a fill value for missing data?)")
    p = run_module("data_tools.prepare", "npz", npz, "--out", out, "--quiet")
    assert p.stderr.splitlines() == [f"g3-prepare: {said}"]
    p = run_module("data_tools.partition", out, "--parts", 2, "--out", out_dir / "parts", "--no-progress")
    assert [ln for ln in p.stderr.splitlines() if "warning" in ln] == [f"g3-partition: {said}"]
    p = run_module("data_tools.inspection", out)
    assert p.stderr.splitlines() == [f"g3-inspect: {said}"]
    p = run_module("data_tools.prepare", "npz", npz, "--out", out, "--normalize-features", "--force", "--quiet")
    assert p.stderr == ""


def test_terminated_by_sigterm_leaves_nothing(tmp_path, out_dir):
    """SIGTERM while the graph file is being written (a batch job's time limit): one line, exit 143, and the
    hidden temporary file removed. Before, Python's default action ended the process and left it."""
    import subprocess
    import sys
    from tests.conftest import tool_env
    code = ("import os, sys; from g3mpi.format.graph import GraphWriter; "
            "GraphWriter.write_csr = lambda *a, **k: os.kill(os.getpid(), 15); "
            "from data_tools.prepare import main; sys.exit(main(sys.argv[1:]))")
    out = out_dir / "g.h5"
    p = subprocess.run([sys.executable, "-c", code, "npz", str(cora_like(tmp_path / "g.npz")), "--out", str(out)],
                       capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 143, p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"g3-prepare: error: {out}: terminated by SIGTERM (no output written)"
    assert os.listdir(out_dir) == []


@pytest.mark.parametrize("limit_bytes,dim", [(100_000, 8), (2_048_000, 64), (3_072_000, 64)])
def test_disk_full_while_writing(tmp_path, limit_bytes, dim):
    """A write that fails (here the file-size limit, EFBIG; a full disk or quota is ENOSPC / EDQUOT) gave two
    tracebacks: GraphWriter closed the failed HDF5 file a second time, which raised RuntimeError over the OSError.
    Now: one line with the system's message, exit 1, the temporary file removed. With the larger limits the
    write fails in HDF5's final flush, after which h5py crashed at exit (status 139 after the line)."""
    import resource
    d = tmp_path / "o"
    d.mkdir()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))
    p = subprocess.run([sys.executable, "-m", "data_tools.prepare", "rmat", "--scale", "14", "--feature-dim", str(dim),
                        "--out", str(d / "g.h5"), "--quiet"], capture_output=True, text=True, env=tool_env(),
                       preexec_fn=limit)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip() == f"g3-prepare: error: {d / 'g.h5'}: File too large"
    assert os.listdir(d) == []


def test_summary_into_a_closed_pipe(tmp_path):
    """stdout closed by its reader (`g3-prepare ... | head -0`) gave a BrokenPipeError traceback and exit 1 after
    graph.h5 had been written completely."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "data_tools.prepare", "sbm", "--nodes", "60", "--classes", "2",
                        "--feature-dim", "2", "--out", str(tmp_path / "g.h5"), "--quiet"], stdout=w,
                       stderr=subprocess.PIPE, text=True, env=tool_env())
    os.close(w)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert (tmp_path / "g.h5").exists()


def test_sigterm_lost_in_a_callback_still_stops(tmp_path, out_dir):
    """A SIGTERM handled while Python runs a weakref callback or __del__ (h5py and tqdm have them; 2 of 17
    kills during the write here) raised Terminated there, where Python prints 'Exception ignored' and carries on; the
    handler had set the signals to be ignored, so the import finished: graph.h5 written, exit 0, a traceback on
    stderr. The writer now re-raises it before committing. The signal is sent from inside a finalizer here."""
    code = ("import os, signal, sys, weakref\n"
            "from g3mpi.format import graph\n"
            "orig = graph.GraphWriter.write_features\n"
            "class Obj: pass\n"
            "def write_features(self, start, block):\n"
            "    o = Obj()\n"
            "    weakref.finalize(o, lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
            "    del o\n"
            "    return orig(self, start, block)\n"
            "graph.GraphWriter.write_features = write_features\n"
            "from data_tools.prepare import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    out = out_dir / "g.h5"
    p = subprocess.run([sys.executable, "-c", code, "sbm", "--nodes", "60", "--classes", "2", "--feature-dim", "4",
                        "--out", str(out), "--quiet"], capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 143, p.stderr
    assert p.stderr.strip() == f"g3-prepare: error: {out}: terminated by SIGTERM (no output written)"
    assert os.listdir(out_dir) == []
