"""g3-prepare edgelist on bad input: the file and line of a malformed, truncated or non-text edge list, and bad
features, labels and masks beside it."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from tests.prepare_runs import cora_like, fails, make_ogb, out_dir  # noqa: F401 (out_dir: a fixture)

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_edgelist_bad_id_python_would_take", "test_edgelist_empty", "test_edgelist_id_not_in_node_ids",
              "test_edgelist_id_out_of_range_of_features", "test_edgelist_labels_and_masks",
              "test_edgelist_malformed_line", "test_edgelist_malformed_line_far_into_a_gz", "test_edgelist_missing",
              "test_edgelist_nan_features", "test_edgelist_not_text", "test_edgelist_rows_mismatch",
              "test_edgelist_truncated_and_pickled_npy", "test_edgelist_truncated_gz",
              "test_float64_features_beyond_float32", "test_float_label_beyond_int64", "test_text_that_is_not_utf8")


def test_edgelist_empty(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("# nothing here\n\n")
    fails(out_dir, "edgelist", f, path=f, words=["no edges"])


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
