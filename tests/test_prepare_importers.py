"""g3-prepare ogb / edgelist: small inputs written here, imported, read back with load_graph and compared."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from tests.conftest import run_module
from g3mpi.format import load_graph

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


def prepare(*args):
    p = run_module("data_tools.prepare", *args, "--quiet")
    return json.loads(p.stdout.strip().splitlines()[-1])


def edge_set(g, ids=None):
    """{(source, target)} of a loaded graph, by original ID if ``ids`` maps rows to IDs."""
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    src = g.indices.astype(np.int64)
    if ids is not None:
        src, dst = ids[src], ids[dst]
    return sorted(zip(src.tolist(), dst.tolist()))


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


def make_ogb(root, n=30, f=3, c=4, seed=0, schemes=("time",)):
    """A small OGB node-property dataset directory; returns its arrays."""
    rng = np.random.default_rng(seed)
    e = rng.integers(0, n, size=(80, 2))
    x = rng.standard_normal((n, f)).astype(np.float32)
    y = rng.integers(0, c, n).astype(float)
    y[[3, 7]] = np.nan                                    # unlabelled, as in ogbn-papers100M
    write_gz(root / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in e])
    write_gz(root / "raw" / "num-node-list.csv.gz", [str(n)])
    write_gz(root / "raw" / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in x])
    write_gz(root / "raw" / "node-label.csv.gz", ["nan" if np.isnan(v) else str(int(v)) for v in y])
    labelled = np.flatnonzero(~np.isnan(y))
    perm = rng.permutation(labelled)
    splits = {}
    for k, scheme in enumerate(schemes):
        perm = np.roll(perm, 5 * k)
        parts = dict(train=perm[:15], valid=perm[15:20], test=perm[20:])
        for name, idx in parts.items():
            write_gz(root / "split" / scheme / f"{name}.csv.gz", [str(i) for i in idx])
        splits[scheme] = parts
    return e, x, y, splits


def test_ogb_round_trip(tmp_path):
    root = tmp_path / "ogbn_tiny"
    e, x, y, splits = make_ogb(root, schemes=("sales_ranking", "time"))
    out = tmp_path / "g.h5"
    s = prepare("ogb", root, "--out", out, "--split", "time")
    g = load_graph(out)
    assert g.num_nodes == 30 and s["num_edges"] == 80 == g.num_edges
    assert edge_set(g) == sorted(map(tuple, e.tolist()))
    np.testing.assert_array_equal(g.features, x)
    np.testing.assert_array_equal(g.labels, np.where(np.isnan(y), -1, y).astype(np.int64))
    for mask, name in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        np.testing.assert_array_equal(np.flatnonzero(getattr(g, mask)), np.sort(splits["time"][name]))
    assert g.attrs["source"] == "ogb:ogbn_tiny,split=time"
    # default scheme: the first in sorted order; --symmetrize gives the undirected simple graph
    prepare("ogb", root, "--out", out, "--force", "--symmetrize")
    g = load_graph(out)
    np.testing.assert_array_equal(np.flatnonzero(g.train_mask), np.sort(splits["sales_ranking"]["train"]))
    assert edge_set(g) == sorted({(int(u), int(v)) for u, v in e} | {(int(v), int(u)) for u, v in e})


def test_ogb_uncompressed_without_split(tmp_path):
    root = tmp_path / "d"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "edge.csv").write_text("0,1\n1,2\n")
    (root / "raw" / "node-feat.csv").write_text("1,0\n0,1\n1,1\n")
    (root / "raw" / "node-label.csv").write_text("0\n1\n1\n")
    out = tmp_path / "g.h5"
    s = prepare("ogb", root, "--out", out, "--train", "0.34", "--val", "0.33")
    g = load_graph(out)
    assert edge_set(g) == [(0, 1), (1, 2)] and (s["train"], s["val"], s["test"]) == (1, 1, 1)


@pytest.mark.parametrize("sep,name", [(",", "g.csv"), ("\t", "g.tsv"), ("  ", "g.txt")])
def test_edgelist_arbitrary_ids(tmp_path, sep, name):
    rng = np.random.default_rng(1)
    ids = rng.choice(np.arange(-10**12, 10**12, 7919, dtype=np.int64), size=25, replace=False)
    e = ids[rng.integers(0, 25, size=(60, 2))]
    lines = ["# generated edge list", f"source{sep}target{sep}weight"]
    for k, (u, v) in enumerate(e):
        lines.append(f"{u}{sep}{v}{sep}{k * 0.5}" + ("  # note" if k % 7 == 0 else ""))
        if k % 11 == 0:
            lines += ["", "% a comment"]
    f = tmp_path / name
    f.write_text("\n".join(lines) + "\n")
    out = tmp_path / "g.h5"
    s = prepare("edgelist", f, "--out", out)
    g = load_graph(out)
    assert g.orig_ids is not None and np.all(np.diff(g.orig_ids) > 0)
    assert g.num_nodes == len(np.unique(e)) and s["num_edges"] == 60
    assert edge_set(g, g.orig_ids) == sorted(map(tuple, e.tolist()))
    assert g.features.shape == (g.num_nodes, 0) and (g.labels == -1).all()


def test_edgelist_features_labels_masks(tmp_path):
    n = 12
    rng = np.random.default_rng(2)
    e = rng.integers(0, n, size=(40, 2))
    f = tmp_path / "g.txt"
    f.write_text("".join(f"{u} {v}\n" for u, v in e))
    x = rng.random((n, 4)).astype(np.float32)
    y = rng.integers(0, 3, n)
    masks = dict(train_mask=np.arange(n) < 6, val_mask=(np.arange(n) >= 6) & (np.arange(n) < 9),
                 test_mask=np.arange(n) >= 9)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "m.npz", **masks)
    out = tmp_path / "g.h5"
    prepare("edgelist", f, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy", "--masks",
            tmp_path / "m.npz", "--no-header", "--delimiter", "space", "--num-classes", 5, "--out", out)
    g = load_graph(out)
    assert g.num_nodes == n and g.orig_ids is None and g.attrs["num_classes"] == 5
    assert edge_set(g) == sorted(map(tuple, e.tolist()))
    np.testing.assert_array_equal(g.features, x)
    np.testing.assert_array_equal(g.labels, y)
    for k, m in masks.items():
        np.testing.assert_array_equal(getattr(g, k), m)
    # --node-ids: rows named by arbitrary IDs, here the row number times 1000 in reverse order
    node_ids = (np.arange(n)[::-1] * 1000 + 5).astype(np.int64)
    np.save(tmp_path / "ids.npy", node_ids)
    f2 = tmp_path / "g2.csv"
    f2.write_text("".join(f"{node_ids[u]},{node_ids[v]}\n" for u, v in e))
    prepare("edgelist", f2, "--features", tmp_path / "x.npy", "--node-ids", tmp_path / "ids.npy", "--out", out,
            "--force", "--normalize-features", "--dedup")
    g = load_graph(out)
    np.testing.assert_array_equal(g.orig_ids, node_ids)
    assert edge_set(g, g.orig_ids) == sorted({(int(node_ids[u]), int(node_ids[v])) for u, v in e})
    np.testing.assert_allclose(g.features, x / x.sum(1, keepdims=True), rtol=1e-6)


def test_edgelist_random_features(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("a,b\n1,2\n2,3\n")
    out = tmp_path / "g.h5"
    prepare("edgelist", f, "--feature-dim", 8, "--out", out, "--seed", 3)
    g = load_graph(out)
    assert g.features.shape == (3, 8) and g.features.std() > 0.3 and edge_set(g) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("name,text", [("bom.csv", "1,2\n2,3\n3,1\n"), ("bom.csv.gz", "1,2\n2,3\n3,1\n"),
                                       ("bomh.csv", "src,dst\n1,2\n2,3\n3,1\n")])
def test_edgelist_utf8_bom(tmp_path, name, text):
    """A UTF-8 byte-order mark (spreadsheet exports) is not part of the first ID: the first edge was taken for a
    header ('\\ufeff1' is not an integer) and dropped."""
    f = tmp_path / name
    data = b"\xef\xbb\xbf" + text.encode()
    f.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 3 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3), (3, 1)]


def test_edgelist_matrix_market(tmp_path):
    """A MatrixMarket coordinate file ('%' comments): its size line '4 4 3' was read as an edge 4 -> 4; an 'array'
    file (a dense matrix, not an edge list) is refused."""
    f = tmp_path / "g.mtx"
    f.write_text("%%MatrixMarket matrix coordinate pattern general\n% comment\n4 4 3\n1 2\n2 3\n3 1\n")
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 3 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3), (3, 1)]
    f.write_text("%%MatrixMarket matrix array real general\n2 2\n1.0\n0.0\n0.0\n1.0\n")
    p = run_module("data_tools.prepare", "edgelist", f, "--out", tmp_path / "h.h5", check=False)
    assert p.returncode == 1 and p.stderr.strip() == (f"g3-prepare: error: {f}: line 1: only MatrixMarket 'matrix "
                                                      f"coordinate' files are edge lists, got '%%MatrixMarket matrix "
                                                      f"array real general'")


def test_ogb_features_streamed(tmp_path, monkeypatch):
    """node-feat is parsed block by block while graph.h5 is written, never held whole as an [N, F] array (before,
    load_ogb read it into one array first: the peak RSS of a 200k x 128 import went from 292 to 171 MiB)."""
    from data_tools.importers import textio
    from data_tools.importers.common import PrepareOptions, write_raw_graph
    from data_tools.importers.ogb import load_ogb
    root = tmp_path / "d"
    e, x, y, splits = make_ogb(root, n=5000, f=5)
    monkeypatch.setattr(textio, "CHUNK_BYTES", 1000)      # after a first chunk of 4096 lines, chunks of 256
    raw = load_ogb(root, quiet=True)
    assert raw.features is None and raw.feature_dim == 5
    blocks = list(raw.feature_blocks())
    assert len(blocks) == 5 and [s for s, _ in blocks] == list(np.cumsum([0] + [len(b) for _, b in blocks[:-1]]))
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), x)
    write_raw_graph(tmp_path / "g.h5", raw, PrepareOptions(quiet=True))
    np.testing.assert_array_equal(load_graph(tmp_path / "g.h5").features, x)


def test_edgelist_gzip_without_suffix(tmp_path):
    """A gzipped edge list not named *.gz (gzip's magic bytes) is read like one; before, its binary text gave
    'no edges found'."""
    f = tmp_path / "edges.txt"
    f.write_bytes(gzip.compress(b"1 2\n2 3\n3 1\n"))
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 3 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3), (3, 1)]


@pytest.mark.parametrize("text", ["from\tto\n1 2\n2 3\n", "source target\n1,2\n2,3\n",
                                  "# comment\nsource,target,weight\n\n1\t2\t0.5\n2\t3\t1.5\n"])
def test_edgelist_header_with_another_delimiter(tmp_path, text):
    """--delimiter auto is documented as taken from the first data line; it came from the header line, so a
    header 'from<TAB>to' over space-separated data failed with 'line 2: expected at least 2 columns'."""
    f = tmp_path / "e.txt"
    f.write_text(text)
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 2 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3)]


def test_ogb_blank_lines_and_crlf(tmp_path):
    """OGB's CSV files with Windows line ends and blank lines (skipped, as OGB's pandas loader skips them) import
    as docs/PREPARE.md says: the same graph as without them."""
    files = {"raw/edge.csv": "0,1\r\n1,2\r\n\r\n2,3\r\n", "raw/node-feat.csv": "1,2\r\n3,4\r\n\r\n5,6\r\n7,8",
             "raw/node-label.csv": "0\r\n\r\n1\r\n1\r\nnan\r\n", "raw/num-node-list.csv": "4\r\n",
             "split/s/train.csv": "0\r\n1\r\n", "split/s/valid.csv": "\r\n2\r\n", "split/s/test.csv": ""}
    for name, text in files.items():
        (tmp_path / "d" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / name).write_bytes(text.encode())
    prepare("ogb", tmp_path / "d", "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert edge_set(g) == [(0, 1), (1, 2), (2, 3)]
    np.testing.assert_array_equal(g.features, np.arange(1, 9, dtype=np.float32).reshape(4, 2))
    np.testing.assert_array_equal(g.labels, [0, 1, 1, -1])
    np.testing.assert_array_equal(np.stack([g.train_mask, g.val_mask, g.test_mask]),
                                  [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize("text", ["1;2\n2;3\n", "src;dst\n1;2\n2;3\n", "src|dst\n1|2\n2|3\n", "1 ; 2\n2 ; 3\n"])
def test_edgelist_auto_delimiter_semicolon_and_bar(tmp_path, text):
    """--delimiter ';' and '|' were accepted but not detected by 'auto': a semicolon CSV (a spreadsheet's, where
    the decimal mark is a comma) lost its first line as a header and failed with 'line 2: expected at least 2
    columns, found 1: '2;3''."""
    f = tmp_path / "e.csv"
    f.write_text(text)
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 2 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3)]


@pytest.mark.parametrize("text", [b"1 2\r\n2 3\r\n", b"# c\r\nsrc,dst\r\n1,2\r\n\r\n2,3", b"1\t2\r2\t3\r", b"1 2\n2 3"])
@pytest.mark.parametrize("gzipped", [False, True])
def test_edgelist_line_ends(tmp_path, text, gzipped):
    """Windows (CRLF) and old Mac (CR) line ends and a last line without one are accepted, as docs/PREPARE.md
    says, in a gzip file too."""
    f = tmp_path / ("e.txt.gz" if gzipped else "e.txt")
    f.write_bytes(gzip.compress(text) if gzipped else text)
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 2 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3)]


@pytest.mark.parametrize("text", [b"1 2\r\n\r\n2 x\r\n", b"1 2\r\r2 x\r", b"# 1\r\n1 2\n2 x"])
def test_edgelist_line_numbers_with_other_line_ends(tmp_path, text):
    """Errors count lines as the file has them, whatever its line ends."""
    f = tmp_path / "e.txt"
    f.write_bytes(text)
    p = run_module("data_tools.prepare", "edgelist", f, "--out", tmp_path / "g.h5", check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"g3-prepare: error: {f}: line 3: column 2: cannot parse 'x' as an integer"
    assert not (tmp_path / "g.h5").exists()


@pytest.mark.parametrize("text", ["1,2\n  \n2,3\n", "1\t2\n\t\n2\t3\n", "1,2\n   # a comment\n2,3\n",
                                  "src,dst\n1,2\n \t \n2,3\n"])
def test_edgelist_lines_of_only_spaces_or_tabs(tmp_path, text):
    """A line of only spaces or tabs is blank (skipped) in a CSV or TSV too: np.loadtxt with a delimiter takes it
    for a row, and the import failed with 'lines 1-3: cannot parse: could not convert string '  ' to int64'
    (found by fuzzing edge lists)."""
    f = tmp_path / "e.csv"
    f.write_text(text)
    s = prepare("edgelist", f, "--out", tmp_path / "g.h5")
    g = load_graph(tmp_path / "g.h5")
    assert s["num_edges"] == 2 and edge_set(g, g.orig_ids) == [(1, 2), (2, 3)]


def test_edgelist_blank_lines_keep_line_numbers(tmp_path):
    """With lines of spaces skipped, a bad line is still named by its own number."""
    f = tmp_path / "e.csv"
    f.write_text("1,2\n  \n2,3\n3,x\n")
    p = run_module("data_tools.prepare", "edgelist", f, "--out", tmp_path / "g.h5", check=False)
    assert p.returncode == 1 and p.stderr.strip() == (f"g3-prepare: error: {f}: line 4: column 2: cannot parse 'x' "
                                                      f"as an integer")
