"""g3-prepare's link splits and relations (docs/LINKS.md): --link-split on any importer's graph, knowledge-graph
triple files, OGB's link-prediction layout (.pt split files read with weights_only=True), g3-inspect's report, and
the refusals of bad input (one line naming file and line, non-zero exit, nothing written)."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from data_tools.importers.triples import generate_kg
from data_tools.inspection import inspect_path, print_report
from data_tools.prepare import main as prepare_main
from g3mpi.format import load_graph
from g3mpi.format.links import SPLITS, link_name

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_generated_kg_full_size", "test_ogb_link_collab_layout")


def prepare(capsys, *args):
    """g3-prepare in process: (exit status, stderr lines)."""
    rc = prepare_main([str(a) for a in args] + ["-q"])
    return rc, capsys.readouterr().err.strip().splitlines()


def refused(capsys, tmp_path, *args, where, words=()):
    before = sorted(os.listdir(tmp_path))
    rc, err = prepare(capsys, *args, "--out", tmp_path / "g.h5")
    assert rc != 0 and len(err) == 1, err
    assert err[0].startswith(f"g3-prepare: error: {where}"), err[0]
    for w in words:
        assert w in err[0], err[0]
    assert sorted(os.listdir(tmp_path)) == before, "output or temporary files left behind"


def inspected(path) -> str:
    """g3-inspect's report of ``path``."""
    import io
    buf = io.StringIO()
    print_report(inspect_path(path), buf)
    return buf.getvalue()


def csr_edges(g):
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    t = g.edge_type if g.edge_type is not None else np.zeros(len(rows), np.int64)
    return set(zip(g.indices.tolist(), rows.tolist(), t.tolist()))


def test_cora_random_link_split(tmp_path, capsys, cora_npz):
    """85/5/10 of Cora's 5278 undirected edges, as PyG's RandomLinkSplit counts them; both directions held out."""
    out = tmp_path / "c.h5"
    rc, err = prepare(capsys, "npz", cora_npz, "--link-split", "0.85,0.05,0.1", "--split-seed", "0", "--out", out)
    assert rc == 0, err
    g = load_graph(out)
    n = {s: len(g.links[link_name(s, "edge")]) for s in SPLITS}
    assert n == {"train": 4488, "val": 263, "test": 527}
    assert g.attrs["symmetric"] and g.num_edges == 2 * 4488
    edges = csr_edges(g)
    for s in ("val", "test"):
        for u, v in g.links[link_name(s, "edge")].tolist():
            assert (u, v, 0) not in edges and (v, u, 0) not in edges
    for u, v in g.links["link_train_edge"].tolist():
        assert (u, v, 0) in edges and (v, u, 0) in edges
    # node classification data is kept as it was
    assert int(g.train_mask.sum()) == 140 and g.features.shape == (2708, 1433)
    report = inspected(out)
    assert "link train       4488 pairs" in report and "link test        527 pairs" in report


@pytest.mark.parametrize("arg", ["0.8,0.1", "0.8,0.3,0.1", "a,b,c", "-0.1,0.6,0.5"])
def test_bad_link_split_option(tmp_path, capsys, cora_npz, arg):
    with pytest.raises(SystemExit) as e:
        prepare_main(["npz", str(cora_npz), f"--link-split={arg}", "--out", str(tmp_path / "g.h5")])
    assert e.value.code == 2 and "three fractions TRAIN,VAL,TEST summing to 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def write_triples(d, files):
    d.mkdir(exist_ok=True)
    for name, rows in files.items():
        (d / name).write_text("".join("\t".join(r) + "\n" for r in rows))
    return d


KG = {"train.txt": [("a", "likes", "b"), ("b", "likes", "c"), ("c", "knows", "a"), ("d", "knows", "b")],
      "valid.txt": [("a", "knows", "c")], "test.txt": [("d", "likes", "a"), ("b", "knows", "d")]}


@pytest.mark.parametrize("inverse", [False, True])
def test_triples(tmp_path, capsys, inverse):
    d = write_triples(tmp_path / "kg", KG)
    out = tmp_path / "kg.h5"
    rc, err = prepare(capsys, "triples", d, "--out", out, *(["--add-inverse"] if inverse else []))
    assert rc == 0, err
    g = load_graph(out)
    assert g.entity_names == ["a", "b", "c", "d"] and g.features.shape == (4, 0)
    names = ["likes", "knows"] + (["likes_inverse", "knows_inverse"] if inverse else [])
    assert g.relation_names == names and g.num_relations == len(names)
    want = {(0, 1, 0), (1, 2, 0), (2, 0, 1), (3, 1, 1)}
    if inverse:
        want |= {(v, u, r + 2) for u, v, r in want}
        assert g.relation_inverse.tolist() == [2, 3, 0, 1]
    assert csr_edges(g) == want
    assert g.links["link_test_edge"].tolist() == [[3, 0], [1, 3]] and g.links["link_test_edge_type"].tolist() == [0, 1]
    assert g.links["link_val_edge"].tolist() == [[0, 2]] and g.links["link_train_edge"].shape == (4, 2)
    assert f"relations        {len(names)}: likes 2, knows 2" in inspected(out)
    from data_tools.partition import main as partition_main
    assert partition_main([str(out), "--parts", "2", "--method", "random", "--out", str(tmp_path / "p")]) == 0
    report = inspected(tmp_path / "p")
    assert f"relations        {len(names)}: likes 2, knows 2" in report and "link test        2 pairs" in report


def test_triples_bad_input(tmp_path, capsys):
    d = tmp_path / "kg"
    write_triples(d, {**KG, "valid.txt": [("a", "knows", "c"), ("a", "knows")]})
    refused(capsys, tmp_path, "triples", d, where=f"{d / 'valid.txt'}:2",
            words=["expected 3 tab-separated columns (head, relation, tail), got 2"])
    write_triples(d, {**KG, "train.txt": KG["train.txt"] + [("a", "b", "c", "d")]})
    refused(capsys, tmp_path, "triples", d, where=f"{d / 'train.txt'}:5", words=["got 4"])
    write_triples(d, {**KG, "test.txt": [("d", "likes", "a"), ("b", "hates", "d")]})
    refused(capsys, tmp_path, "triples", d, where=f"{d / 'test.txt'}:2", words=["unknown relation 'hates'"])
    write_triples(d, {**KG, "valid.txt": [("zed", "knows", "c")]})
    refused(capsys, tmp_path, "triples", d, where=f"{d / 'valid.txt'}:1", words=["unknown entity 'zed'"])
    # a held-out triple that is also a training triple: leakage
    write_triples(d, {**KG, "test.txt": [("b", "likes", "c")]})
    refused(capsys, tmp_path, "triples", d, where=str(tmp_path / "g.h5"),
            words=["link_test_edge: pair 0 (node 1 -> node 2 (relation 0)) is also an edge", "(leakage)"])
    # with --add-inverse, a test triple whose inverse is trained on is refused too
    write_triples(d, {**KG, "test.txt": [("b", "likes", "a")]})
    rc, err = prepare(capsys, "triples", d, "--out", tmp_path / "ok.h5")
    assert rc == 0, err
    os.remove(tmp_path / "ok.h5")
    os.remove(tmp_path / "ok.h5.prepare.json")
    (d / "test.txt").unlink()
    refused(capsys, tmp_path, "triples", d, where=str(d / "test.txt"), words=["no such file"])


def test_generated_kg_full_size(tmp_path, capsys):
    """The benchmark's knowledge graph: 10k entities, 20 relations, 200k triples, no held-out triple trained on."""
    counts = generate_kg(tmp_path / "kg", 10_000, 20, 200_000, seed=0)
    assert sum(counts.values()) == 200_000 and counts["test"] == counts["valid"] == 10_000
    rc, err = prepare(capsys, "triples", tmp_path / "kg", "--add-inverse", "--out", tmp_path / "kg.h5")
    assert rc == 0, err
    g = load_graph(tmp_path / "kg.h5")
    assert g.num_relations == 40 and g.num_edges == 2 * counts["train"] and g.num_nodes <= 10_000


def test_generated_kg_is_seeded(tmp_path):
    generate_kg(tmp_path / "a", 200, 4, 2000, seed=1)
    generate_kg(tmp_path / "b", 200, 4, 2000, seed=1)
    generate_kg(tmp_path / "c", 200, 4, 2000, seed=2)
    text = {k: (tmp_path / k / "test.txt").read_text() for k in "abc"}
    assert text["a"] == text["b"] != text["c"]


def make_ogb_link(root, n=6, style="collab", valid=None):
    """An OGB link-prediction dataset directory as it ships (raw/*.csv.gz, split/<scheme>/*.pt of tensors)."""
    import torch
    (root / "raw").mkdir(parents=True)
    with gzip.open(root / "raw" / "edge.csv.gz", "wt") as f:
        f.write("0,1\n1,2\n2,3\n3,4\n")
    with gzip.open(root / "raw" / "num-node-list.csv.gz", "wt") as f:
        f.write(f"{n}\n")
    with gzip.open(root / "raw" / "node-feat.csv.gz", "wt") as f:
        f.write("".join(f"{i},{i * 0.5}\n" for i in range(n)))
    scheme = root / "split" / ("collab" if style == "collab" else "time")
    scheme.mkdir(parents=True)
    t = torch.tensor
    if style == "collab":
        torch.save({"edge": t([[0, 1], [1, 2], [2, 3], [3, 4]]), "weight": t([1, 1, 2, 1]),
                    "year": t([2000, 2001, 2002, 2003])}, scheme / "train.pt")
        torch.save({"edge": t(valid or [[0, 5]]), "edge_neg": t([[1, 5], [2, 4], [0, 3]])}, scheme / "valid.pt")
        torch.save({"edge": t([[4, 5]]), "edge_neg": t([[1, 4], [0, 2]])}, scheme / "test.pt")
    else:
        torch.save({"source_node": t([0, 1, 2, 3]), "target_node": t([1, 2, 3, 4])}, scheme / "train.pt")
        torch.save({"source_node": t([0, 5]), "target_node": t([5, 2]) if valid is None else t(valid),
                    "target_node_neg": t([[2, 3, 4], [0, 1, 3]])}, scheme / "valid.pt")
        torch.save({"source_node": t([4]), "target_node": t([0]), "target_node_neg": t([[1, 2, 3]])},
                   scheme / "test.pt")
    return root


def test_ogb_link_collab_layout(tmp_path, capsys):
    root = make_ogb_link(tmp_path / "ogbl-collab")
    rc, err = prepare(capsys, "ogb", root, "--symmetrize", "--out", tmp_path / "g.h5")
    assert rc == 0, err
    g = load_graph(tmp_path / "g.h5")
    assert g.links["link_val_edge"].tolist() == [[0, 5]]
    assert g.links["link_val_edge_neg"].tolist() == [[1, 5], [2, 4], [0, 3]]
    assert g.links["link_train_edge"].shape == (4, 2) and g.num_edges == 8 and g.features.shape == (6, 2)


def test_ogb_link_citation2_layout(tmp_path, capsys):
    root = make_ogb_link(tmp_path / "ogbl-citation2", style="citation2")
    rc, err = prepare(capsys, "ogb", root, "--out", tmp_path / "g.h5")
    assert rc == 0, err
    g = load_graph(tmp_path / "g.h5")
    assert g.links["link_val_edge"].tolist() == [[0, 5], [5, 2]]
    assert g.links["link_val_target_node_neg"].tolist() == [[2, 3, 4], [0, 1, 3]]
    assert g.links["link_test_target_node_neg"].shape == (1, 3)


def test_ogb_link_bad_input(tmp_path, capsys):
    root = make_ogb_link(tmp_path / "a", valid=[[0, 9]])
    refused(capsys, tmp_path, "ogb", root, where=str(tmp_path / "g.h5"),
            words=["link_val_edge: pair 0 names node 9, out of range [0, 6)"])
    root = make_ogb_link(tmp_path / "b", valid=[[2, 3]])      # a training edge as a validation pair
    refused(capsys, tmp_path, "ogb", root, where=str(tmp_path / "g.h5"),
            words=["link_val_edge: pair 0 (node 2 -> node 3) is also an edge", "(leakage)"])
    refused(capsys, tmp_path, "ogb", make_ogb_link(tmp_path / "c", valid=[[1, 0]]), "--symmetrize",
            where=str(tmp_path / "g.h5"), words=["pair 0 (node 1 -> node 0) is also an edge"])
    import torch
    root = make_ogb_link(tmp_path / "d")
    torch.save({"edge": torch.tensor([[0, 5]]), "cls": Exotic()}, root / "split" / "collab" / "valid.pt")
    refused(capsys, tmp_path, "ogb", root, where=str(root / "split" / "collab" / "valid.pt"),
            words=["not a torch file of tensors (read with weights_only=True"])
    torch.save([1, 2], root / "split" / "collab" / "valid.pt")
    refused(capsys, tmp_path, "ogb", root, where=str(root / "split" / "collab" / "valid.pt"),
            words=["expected a dict of tensors, got list"])


class Exotic:
    """An object torch.load(weights_only=True) must not unpickle."""


def test_relation_id_out_of_range(tmp_path):
    import data_tools
    from g3mpi.format import FormatError
    with pytest.raises(FormatError, match=r"g.h5: edge_type: relation ID 3 of edge 1 out of range \[0, 2\)"):
        data_tools.write_graph(tmp_path / "g.h5", np.array([[0, 1], [1, 2]]), None, num_nodes=3,
                               edge_type=np.array([0, 3]), num_relations=2)
    assert not any(tmp_path.iterdir())


def make_ogb_mag(root):
    """A tiny heterogeneous OGB dataset in ogbn-mag's raw layout: papers (features, labels, split) and authors."""
    files = {"raw/num-node-dict.csv.gz": "author,paper\n2,3\n",
             "raw/relations/author___writes___paper/edge.csv.gz": "0,0\n0,1\n1,2\n",
             "raw/relations/paper___cites___paper/edge.csv.gz": "0,1\n1,2\n2,0\n",
             "raw/node-feat/paper/node-feat.csv.gz": "1,2,3\n4,5,6\n7,8,9\n",
             "raw/node-label/paper/node-label.csv.gz": "0\n1\n2\n",
             "split/time/paper/train.csv.gz": "0\n", "split/time/paper/valid.csv.gz": "1\n",
             "split/time/paper/test.csv.gz": "2\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(root / name, "wt") as f:
            f.write(text)
    return root


def test_ogb_heterogeneous_layout(tmp_path, capsys):
    root = make_ogb_mag(tmp_path / "ogbn_mag")
    rc, err = prepare(capsys, "ogb", root, "--out", tmp_path / "g.h5")
    assert rc == 0, err
    g = load_graph(tmp_path / "g.h5")
    assert g.node_type.tolist() == [0, 0, 1, 1, 1] and g.node_type_names == ["author", "paper"]
    assert g.node_type_feature_dim.tolist() == [0, 3] and g.features.shape == (5, 3)
    assert g.features[:2].tolist() == [[0, 0, 0]] * 2 and g.features[2:].tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert g.relation_names == ["author___writes___paper", "paper___cites___paper"]
    assert csr_edges(g) == {(0, 2, 0), (0, 3, 0), (1, 4, 0), (2, 3, 1), (3, 4, 1), (4, 2, 1)}
    assert g.labels.tolist() == [-1, -1, 0, 1, 2] and np.flatnonzero(g.test_mask).tolist() == [4]
    from data_tools.build import write_partition
    from g3mpi.format import read_part
    write_partition(g, np.array([0, 1, 0, 1, 0]), 2, tmp_path / "p", method="random", seed=0)
    types = {}
    for p in range(2):
        part = read_part(tmp_path / "p", p)
        gid = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])
        types.update(zip(gid.tolist(), part.node_type.tolist()))
    new_to_orig = np.concatenate([read_part(tmp_path / "p", p).orig_ids for p in range(2)])
    assert all(t == g.node_type[new_to_orig[k]] for k, t in types.items())
    with gzip.open(root / "raw/relations/paper___cites___paper/edge.csv.gz", "wt") as f:
        f.write("0,1\n1,3\n")
    (tmp_path / "bad").mkdir()
    refused(capsys, tmp_path / "bad", "ogb", root, where=root / "raw/relations/paper___cites___paper/edge.csv.gz",
            words=["line 2: paper ID 3 out of range [0, 3)"])
