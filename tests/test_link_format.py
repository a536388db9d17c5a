"""Link splits and edge types in graph.h5 and the part files (docs/FORMAT.md, "Link splits and edge types"): the
round trip through data_tools.write_graph and the partition writer, no held-out edge in any part's message-passing
graph, the pairs on their source's owner, old versions still read, and each refusal naming the dataset and pair."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

import data_tools
from data_tools.build import write_partition
from g3mpi.format import FormatError, load_graph, read_meta, read_node_map, read_part
from g3mpi.format.links import SPLITS, link_name


def typed_edges(n=60, m=400, R=5, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    return np.stack([src, dst]), rng.integers(0, R, m)


@pytest.fixture
def typed(tmp_path):
    """A typed graph without features, with a random link split (undirected) and fixed negatives."""
    ei, t = typed_edges()
    path = tmp_path / "g.h5"
    data_tools.write_graph(path, ei, None, num_nodes=60, edge_type=t, num_relations=5,
                           relation_names=[f"r{i}" for i in range(5)], symmetrize=True, link_split=(0.7, 0.1, 0.2),
                           split_seed=3)
    return path


def global_edges(part):
    """(source, target, relation) of every local CSR edge of a part, by new global IDs."""
    gid = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])
    dst = np.repeat(np.arange(part.owned_start, part.owned_end), np.diff(part.indptr))
    return gid[part.indices], dst, part.edge_type


def test_typed_graph_round_trip(typed):
    g = load_graph(typed)
    assert g.num_relations == 5 and g.relation_names == [f"r{i}" for i in range(5)]
    assert g.features.shape == (60, 0) and g.attrs["version"] == 3
    counts = {s: len(g.links[link_name(s, "edge")]) for s in SPLITS}
    total = sum(counts.values())
    assert counts["val"] == int(0.1 * total) and counts["test"] == int(0.2 * total)
    for s in SPLITS:   # undirected pairs, smaller ID first, one relation each
        e = g.links[link_name(s, "edge")]
        assert np.all(e[:, 0] < e[:, 1]) and len(g.links[link_name(s, "edge_type")]) == len(e)
    # rows sorted by source then relation
    rows = np.repeat(np.arange(60), np.diff(g.indptr))
    order = np.lexsort((g.edge_type, g.indices, rows))
    assert np.array_equal(order, np.arange(len(order)))


def test_same_seed_same_split_other_seed_other(tmp_path, typed):
    ei, t = typed_edges()
    other = tmp_path / "o.h5"
    kw = dict(num_nodes=60, edge_type=t, num_relations=5, symmetrize=True, link_split=(0.7, 0.1, 0.2))
    data_tools.write_graph(other, ei, None, split_seed=3, **kw)
    a, b = load_graph(typed), load_graph(other)
    assert all(np.array_equal(a.links[k], b.links[k]) for k in a.links)
    data_tools.write_graph(other, ei, None, split_seed=4, force=True, **kw)
    assert not np.array_equal(a.links["link_test_edge"], load_graph(other).links["link_test_edge"])


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_partition_pairs_on_source_owner_and_no_leakage(tmp_path, typed, parts):
    g = load_graph(typed)
    rng = np.random.default_rng(parts)
    write_partition(g, rng.integers(0, parts, 60), parts, tmp_path / "p", method="random", seed=0)
    meta = read_meta(tmp_path / "p")
    new_to_orig = read_node_map(tmp_path / "p", meta)
    orig_to_new = np.argsort(new_to_orig)
    assert meta["num_relations"] == 5 and meta["links"]["val"]["edge"] == len(g.links["link_val_edge"])
    graph_edges, got = set(), {s: [] for s in SPLITS}
    for p in range(parts):
        part = read_part(tmp_path / "p", p, meta)
        graph_edges |= set(zip(*(a.tolist() for a in global_edges(part))))
        for s in SPLITS:
            e = part.links[link_name(s, "edge")]
            assert np.all((e[:, 0] >= part.owned_start) & (e[:, 0] < part.owned_end))
            got[s].append((part.links[link_name(s, "edge_index")], e, part.links[link_name(s, "edge_type")]))
    for s in SPLITS:   # the union of the parts, by position, is the graph's split relabelled
        idx = np.concatenate([x[0] for x in got[s]])
        order = np.argsort(idx)
        assert np.array_equal(idx[order], np.arange(len(g.links[link_name(s, "edge")])))
        assert np.array_equal(np.concatenate([x[1] for x in got[s]])[order],
                              orig_to_new[g.links[link_name(s, "edge")]])
        assert np.array_equal(np.concatenate([x[2] for x in got[s]])[order], g.links[link_name(s, "edge_type")])
    # the graph is symmetric: a held-out pair is in no part's CSR in either direction, with its relation
    for s in ("val", "test"):
        for (_, e, t) in got[s]:
            for (u, v), r in zip(e.tolist(), t.tolist()):
                assert (u, v, r) not in graph_edges and (v, u, r) not in graph_edges
    # and the training pairs are (in both directions: symmetric)
    for (_, e, t) in got["train"]:
        for (u, v), r in zip(e.tolist(), t.tolist()):
            assert (u, v, r) in graph_edges and (v, u, r) in graph_edges
    # the typed edges of the parts are the graph's, relabelled
    rows = np.repeat(np.arange(60), np.diff(g.indptr))
    want = set(zip(orig_to_new[g.indices].tolist(), orig_to_new[rows].tolist(), g.edge_type.tolist()))
    assert graph_edges == {e for e in want if e[0] != e[1]}


def test_untyped_split_with_fixed_negatives_partitioned(tmp_path):
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 40, 200), rng.integers(0, 40, 200)
    keep = (src != dst)
    ei = np.stack([src[keep], dst[keep]])
    val = np.array([[0, 1], [2, 3]])
    hold = np.isin(ei[0] * 40 + ei[1], val[:, 0] * 40 + val[:, 1])
    ei = ei[:, ~hold]
    links = {"train": {"edge": ei.T}, "val": {"edge": val, "edge_neg": np.array([[5, 6], [7, 8], [9, 1]]),
                                           "target_node_neg": np.array([[4, 5, 6], [7, 8, 9]])}}
    data_tools.write_graph(tmp_path / "g.h5", ei, np.ones((40, 2)), links=links)
    g = load_graph(tmp_path / "g.h5")
    assert g.edge_type is None and g.links["link_val_target_node_neg"].shape == (2, 3)
    write_partition(g, np.arange(40) % 2, 2, tmp_path / "p", method="random", seed=0)
    meta = read_meta(tmp_path / "p")
    assert meta["links"] == {"train": {"edge": ei.shape[1]}, "val": {"edge": 2, "edge_neg": 3, "target_node_neg": 3}}
    orig_to_new = np.argsort(read_node_map(tmp_path / "p", meta))
    negs, shared = [], []
    for p in range(2):
        part = read_part(tmp_path / "p", p, meta)
        assert part.edge_type is None and part.num_relations == 0
        negs += list(zip(part.links["link_val_edge_index"].tolist(), part.links["link_val_target_node_neg"].tolist()))
        shared += list(zip(part.links["link_val_edge_neg_index"].tolist(), part.links["link_val_edge_neg"].tolist()))
    assert [n for _, n in sorted(negs)] == orig_to_new[links["val"]["target_node_neg"]].tolist()
    assert [n for _, n in sorted(shared)] == orig_to_new[links["val"]["edge_neg"]].tolist()


def test_version_2_graph_and_version_3_partition_still_read(tmp_path):
    """The bump only added optional datasets: an older file reads as a graph without splits or types."""
    data_tools.write_graph(tmp_path / "g.h5", np.array([[0, 1], [1, 2]]), np.ones((3, 1)))
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        f.attrs["version"] = 2
    g = load_graph(tmp_path / "g.h5")
    assert g.links is None and g.edge_type is None and g.num_relations == 0


def test_new_versions_refused_by_name(tmp_path):
    data_tools.write_graph(tmp_path / "g.h5", np.array([[0, 1], [1, 2]]), np.ones((3, 1)))
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        f.attrs["version"] = 4
    with pytest.raises(FormatError, match=r"g.h5: format version 4 is not supported \(reads versions 2 to 3\)"):
        load_graph(tmp_path / "g.h5")


BAD = [
    ({"val": {"edge": np.array([[0, 9]])}}, None, r"g.h5: link_val_edge: pair 0 names node 9, out of range \[0, 5\)"),
    ({"test": {"edge": np.array([[4, 0], [0, 1]])}}, None,
     r"g.h5: link_test_edge: pair 1 \(node 0 -> node 1\) is also an edge of the message-passing graph: a held-out "
     r"edge must not be trained on \(leakage\)"),
    ({"val": {"edge": np.array([[2, 4]]), "edge_type": np.array([7])}}, np.array([0, 1, 0, 1]),
     r"g.h5: link_val_edge_type: relation ID 7 of edge 0 out of range \[0, 2\)"),
    ({"val": {"edge": np.array([[1, 0]]), "edge_type": np.array([0])}}, np.array([0, 1, 0, 1]), None),
    ({"val": {"edge": np.array([[0, 1]]), "edge_type": np.array([0])}}, np.array([0, 1, 0, 1]),
     r"pair 0 \(node 0 -> node 1 \(relation 0\)\) is also an edge"),
    ({"val": {"edge": np.array([[0, 1]]), "edge_type": np.array([1])}}, np.array([0, 1, 0, 1]), None),
    ({"val": {"edge": np.array([[0, 2]]), "target_node_neg": np.array([[1, 2], [3, 4]])}}, None,
     r"link_val_target_node_neg has shape \(2, 2\), expected \(1, negatives per positive\)"),
]


@pytest.mark.parametrize("links,types,message", BAD)
def test_bad_links_refused_nothing_written(tmp_path, links, types, message):
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 4]])
    kw = dict(edge_type=types, num_relations=2) if types is not None else {}
    out = tmp_path / "g.h5"
    if message is None:
        data_tools.write_graph(out, ei, None, num_nodes=5, links=links, **kw)
        assert load_graph(out).links
        return
    with pytest.raises(FormatError, match=message):
        data_tools.write_graph(out, ei, None, num_nodes=5, links=links, **kw)
    assert list(tmp_path.iterdir()) == []


def test_relation_id_out_of_range_and_leak_in_file_refused_on_load(tmp_path):
    """A file damaged after writing (checksums rewritten) is refused on load too, naming the dataset."""
    from g3mpi.format.checksums import array_sha256
    ei, t = np.array([[0, 1, 2], [1, 2, 3]]), np.array([0, 1, 1])
    out = tmp_path / "g.h5"
    data_tools.write_graph(out, ei, None, num_nodes=4, edge_type=t, num_relations=2,
                           links={"val": {"edge": np.array([[0, 3]]), "edge_type": np.array([1])}})
    with h5py.File(out, "r+") as f:
        bad = np.array([0, 5, 1], dtype=np.int32)
        f["edge_type"][...] = bad
        f["edge_type"].attrs["sha256"] = array_sha256(bad)
    with pytest.raises(FormatError, match=r"g.h5: edge_type: relation ID 5 of edge 1 out of range \[0, 2\)"):
        load_graph(out)
    with h5py.File(out, "r+") as f:
        f["edge_type"][...] = t.astype(np.int32)
        f["edge_type"].attrs["sha256"] = array_sha256(t.astype(np.int32))
        leak = np.array([[1, 2]], dtype=np.int64)
        f["link_val_edge"][...] = leak
        f["link_val_edge"].attrs["sha256"] = array_sha256(leak)
    with pytest.raises(FormatError, match=r"link_val_edge: pair 0 \(node 1 -> node 2 \(relation 1\)\) is also an "
                                          r"edge of the message-passing graph"):
        load_graph(out)


def test_stream_partitioner_refuses_typed_graph(typed):
    from data_tools.slices import read_slice
    with pytest.raises(FormatError, match="g.h5: has edge types, which g3-partition --method stream does not"):
        read_slice(typed, np.array([0, 60]), 0)
