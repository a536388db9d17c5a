"""g3-prepare ogb on bad input: a missing or damaged dataset directory, unsupported layouts, inconsistent counts."""
from __future__ import annotations

import gzip


from tests.prepare_runs import fails, make_ogb, out_dir  # noqa: F401 (out_dir: a fixture)

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_ogb_bad_files", "test_ogb_duplicate_split_index", "test_ogb_edge_count_checked",
              "test_ogb_label_beyond_int64", "test_ogb_missing", "test_ogb_node_count_from_the_labels_is_named",
              "test_ogb_truncated_gz", "test_ogb_unsupported_layouts")


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
    """ogbn-proteins (112 label columns, no node-feat) and ogbn-mag (raw/relations/) are named as unsupported;
    before, each failed with 'node-feat.csv.gz' or 'edge.csv.gz: no such file'. (The binary layout of
    ogbn-papers100M is read: tests/test_prepare_ogb_binary.py.)"""
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
