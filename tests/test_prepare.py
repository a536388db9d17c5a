"""g3-prepare: CSR construction, the npz importer and the sbm / rmat generators, round-tripped through graph.h5."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import run_module
from data_tools.importers import common
from data_tools.importers.common import build_in_csr, normalize_rows
from data_tools.importers.rmat import rmat_edges
from g3mpi.format import load_graph

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_cora_round_trip", "test_npz_options", "test_rmat_round_trip", "test_sbm_p_in_p_out",
              "test_sbm_structure", "test_split_fractions_of_an_input_with_its_own_split_are_named")


def edges_of(g):
    """(src, dst) of every stored edge, sorted by (dst, src) as the CSR stores them."""
    dst = np.repeat(np.arange(g.num_nodes, dtype=np.int64), np.diff(g.indptr))
    return g.indices.astype(np.int64), dst


def sorted_pairs(src, dst):
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    order = np.lexsort((src, dst))
    return np.stack([src[order], dst[order]])


def prepare(*args):
    p = run_module("data_tools.prepare", *args, "--quiet")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- CSR builder

def reference_csr(n, src, dst, symmetrize, self_loops, dedup):
    pairs = list(zip(src.tolist(), dst.tolist()))
    if symmetrize:
        pairs += [(v, u) for u, v in pairs]
    if dedup or symmetrize:
        pairs = list(set(pairs))
    if self_loops in ("drop", "add"):
        pairs = [(u, v) for u, v in pairs if u != v]
    if self_loops == "add":
        pairs += [(v, v) for v in range(n)]
    pairs.sort(key=lambda p: (p[1], p[0]))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount([v for _, v in pairs], minlength=n), out=indptr[1:])
    return indptr, np.array([u for u, _ in pairs], dtype=np.int64)


@pytest.mark.parametrize("symmetrize", [False, True])
@pytest.mark.parametrize("self_loops", ["keep", "drop", "add"])
@pytest.mark.parametrize("dedup", [False, True])
def test_build_in_csr_matches_reference(monkeypatch, symmetrize, self_loops, dedup):
    # tiny chunks and sort blocks, so the chunked fill and the per-block compaction are exercised
    monkeypatch.setattr(common, "EDGE_CHUNK", 7)
    monkeypatch.setattr(common, "SORT_BLOCK", 5)
    rng = np.random.default_rng(3)
    n = 13
    src = rng.integers(0, n, 120).astype(np.int32)
    dst = rng.integers(0, n, 120).astype(np.int32)
    src[:5] = dst[:5]                      # some self loops, repeated below
    src[5:10], dst[5:10] = src[:5], dst[:5]
    indptr, indices = build_in_csr(n, src, dst, symmetrize=symmetrize, self_loops=self_loops, dedup=dedup,
                                   quiet=True)
    ref_ptr, ref_idx = reference_csr(n, src, dst, symmetrize, self_loops, dedup)
    np.testing.assert_array_equal(indptr, ref_ptr)
    np.testing.assert_array_equal(indices, ref_idx)
    assert indices.dtype == np.int32


def test_build_in_csr_isolated_nodes_and_empty():
    indptr, indices = build_in_csr(5, np.array([], dtype=np.int64), np.array([], dtype=np.int64), quiet=True)
    assert indptr.tolist() == [0] * 6 and len(indices) == 0
    indptr, indices = build_in_csr(4, np.array([3, 0]), np.array([1, 1]), self_loops="add", quiet=True)
    assert indptr.tolist() == [0, 1, 4, 5, 6] and indices.tolist() == [0, 0, 1, 3, 2, 3]


def test_normalize_rows():
    x = np.array([[1, 3, 0], [0, 0, 0], [-2, 2, 4]], dtype=np.float32)
    y = normalize_rows(x)
    np.testing.assert_allclose(y, [[0.25, 0.75, 0], [0, 0, 0], [-0.25, 0.25, 0.5]])


# ---------------------------------------------------------------------------------------------- npz

def test_cora_round_trip(cora_npz, tmp_path):
    out = tmp_path / "cora.h5"
    s = prepare("npz", cora_npz, "--out", out)
    assert (s["num_nodes"], s["num_edges"]) == (2708, 10556)
    g = load_graph(out)
    z = np.load(cora_npz, allow_pickle=False)
    assert g.num_nodes == 2708 and g.num_edges == 10556
    np.testing.assert_array_equal(sorted_pairs(*edges_of(g)), sorted_pairs(z["edge_index"][0], z["edge_index"][1]))
    np.testing.assert_array_equal(g.features, z["x"])
    np.testing.assert_array_equal(g.labels, z["y"])
    for k in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(g, k), z[k])
    assert g.attrs["num_classes"] == 7 and g.attrs["source"] == "npz:cora.npz"
    assert g.orig_ids is None
    # every row's sources sorted ascending
    d = np.diff(g.indices.astype(np.int64))
    assert np.all((d >= 0) | (np.diff(edges_of(g)[1]) > 0))
    assert oct(os.stat(out).st_mode & 0o777) != "0o600"
    # cora already lists both directions: symmetrizing changes nothing but the attribute
    s = prepare("npz", cora_npz, "--out", out, "--force", "--symmetrize")
    g2 = load_graph(out)
    assert s["num_edges"] == 10556 and g2.attrs["symmetric"]
    np.testing.assert_array_equal(g2.indices, g.indices)


def test_npz_options(tmp_path):
    # a directed multigraph with a self loop: check each option end to end through the CLI
    ei = np.array([[0, 0, 1, 2, 2, 3], [1, 1, 2, 2, 0, 1]])
    x = np.array([[1, 1], [2, 0], [0, 0], [3, 1]], dtype=np.float32)
    y = np.array([0, 1, 2, -1])
    f = tmp_path / "g.npz"
    np.savez(f, edge_index=ei, x=x, y=y)
    out = tmp_path / "g.h5"
    prepare("npz", f, "--out", out, "--symmetrize", "--self-loops", "drop", "--normalize-features",
            "--train", "0.34", "--val", "0.33", "--seed", "5")
    g = load_graph(out)
    want = {(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2), (3, 1), (1, 3)}
    assert set(zip(*map(np.ndarray.tolist, edges_of(g)))) == want and g.num_edges == len(want)
    assert g.attrs["symmetric"] and g.attrs["self_loops"] == "drop"
    np.testing.assert_allclose(g.features, [[.5, .5], [1, 0], [0, 0], [.75, .25]])
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (1, 1, 1)
    assert not (g.train_mask | g.val_mask | g.test_mask)[3]      # unlabelled nodes are in no split
    # the same seed gives the same split; keep + dedup keeps the self loop once
    prepare("npz", f, "--out", out, "--force", "--dedup", "--train", "0.34", "--val", "0.33", "--seed", "5")
    g2 = load_graph(out)
    np.testing.assert_array_equal(g.train_mask, g2.train_mask)
    assert sorted(zip(*map(np.ndarray.tolist, edges_of(g2)))) == sorted({(0, 1), (1, 2), (2, 2), (2, 0), (3, 1)})
    prepare("npz", f, "--out", out, "--force", "--self-loops", "add")
    g3 = load_graph(out)
    assert g3.num_edges == 6 - 1 + 4 and g3.attrs["self_loops"] == "add"


# ---------------------------------------------------------------------------------------------- generators

def test_sbm_structure(tmp_path):
    out = tmp_path / "sbm.h5"
    s = prepare("sbm", "--nodes", 2000, "--classes", 4, "--feature-dim", 16, "--avg-degree", 8, "--homophily",
                0.75, "--seed", 1, "--out", out)
    g = load_graph(out)
    src, dst = edges_of(g)
    assert g.num_nodes == 2000 and g.attrs["symmetric"] and s["num_edges"] == g.num_edges
    assert not np.any(src == dst)                                            # no self loops
    pairs = src * g.num_nodes + dst
    assert len(np.unique(pairs)) == len(pairs)                               # no duplicates
    assert np.array_equal(np.sort(pairs), np.sort(dst * g.num_nodes + src))  # symmetric
    assert 7.5 < g.num_edges / g.num_nodes <= 8.0                            # average degree
    assert abs(np.mean(g.labels[src] == g.labels[dst]) - 0.75) < 0.03        # homophily
    assert np.bincount(g.labels).tolist() == [500] * 4                      # balanced classes
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (1200, 400, 400)
    # class-correlated features: each class mean is far closer to its own centre than to others
    means = np.stack([g.features[g.labels == c].mean(0) for c in range(4)])
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1)
    assert dist[~np.eye(4, dtype=bool)].min() > 0.5
    # deterministic per seed
    out2 = tmp_path / "sbm2.h5"
    prepare("sbm", "--nodes", 2000, "--classes", 4, "--feature-dim", 16, "--avg-degree", 8, "--homophily",
            0.75, "--seed", 1, "--out", out2)
    g2 = load_graph(out2)
    np.testing.assert_array_equal(g2.indices, g.indices)
    np.testing.assert_array_equal(g2.features, g.features)


def test_sbm_p_in_p_out(tmp_path):
    out = tmp_path / "sbm.h5"
    prepare("sbm", "--nodes", 1000, "--classes", 2, "--feature-dim", 4, "--p-in", 0.02, "--p-out", 0.004,
            "--out", out)
    g = load_graph(out)
    src, dst = edges_of(g)
    # expected degree 0.02 * 499 + 0.004 * 500 = 11.98, intra fraction 9.98 / 11.98
    assert 11.0 < g.num_edges / 1000 < 12.5
    assert abs(np.mean(g.labels[src] == g.labels[dst]) - 9.98 / 11.98) < 0.04


def test_rmat_quadrant_probabilities():
    src, dst = rmat_edges(1, 50_000, seed=2, scramble=False, quiet=True)
    q = np.bincount(src.astype(np.int64) * 2 + dst, minlength=4) / len(src)
    np.testing.assert_allclose(q, [0.57, 0.19, 0.19, 0.05], atol=0.01)   # (0,0)=a, (0,1)=b, (1,0)=c, (1,1)=d


def test_rmat_round_trip(tmp_path):
    out = tmp_path / "rmat.h5"
    s = prepare("rmat", "--scale", 10, "--edge-factor", 8, "--feature-dim", 5, "--classes", 3, "--seed", 4,
                "--out", out)
    g = load_graph(out)
    assert g.num_nodes == 1024 and g.num_edges == 8 * 1024 == s["num_edges"]   # keep: every generated edge
    src, dst = rmat_edges(10, 8, seed=4, quiet=True)
    np.testing.assert_array_equal(sorted_pairs(*edges_of(g)), sorted_pairs(src, dst))
    indeg = np.diff(g.indptr)
    assert indeg.max() > 20 * indeg.mean()                                      # skewed, power-law-like
    assert g.features.shape == (1024, 5) and np.isfinite(g.features).all()
    assert set(np.unique(g.labels)) == {0, 1, 2}
    assert g.attrs["source"].startswith("rmat:scale=10,ef=8")
    # --dedup --symmetrize: a simple undirected graph with the same edge set
    out2 = tmp_path / "rmat2.h5"
    prepare("rmat", "--scale", 10, "--edge-factor", 8, "--feature-dim", 5, "--classes", 3, "--seed", 4,
            "--symmetrize", "--self-loops", "drop", "--out", out2)
    g2 = load_graph(out2)
    s2, d2 = edges_of(g2)
    keys = set((src.astype(np.int64) * 1024 + dst).tolist()) | set((dst.astype(np.int64) * 1024 + src).tolist())
    keys = {k for k in keys if k // 1024 != k % 1024}
    assert set((s2 * 1024 + d2).tolist()) == keys and g2.num_edges == len(keys)
    np.testing.assert_array_equal(g2.features, g.features)                     # features depend on the seed only


def test_generators_follow_the_seed():
    """sbm and rmat: the same seed gives the same graph, another seed another one, in its edges, labels and
    features. The 1-class sbm (an Erdos-Renyi graph: its labels do not depend on the seed) shows that the edges
    themselves follow the seed. (A mutation run found this untested: edges drawn from a fixed seed passed every
    test, since the tests only compared two graphs of the same seed.)"""
    from data_tools.importers.rmat import generate_rmat
    from data_tools.importers.sbm import generate_sbm

    def draw(gen, seed):
        raw = gen(seed)
        x = np.concatenate([b for _, b in raw.feature_blocks()])
        return sorted_pairs(*raw.edge_stream().arrays()), raw.labels, x

    for gen in (lambda seed: generate_sbm(300, 1, 4, avg_degree=6, seed=seed, quiet=True),
                lambda seed: generate_sbm(300, 3, 4, avg_degree=6, seed=seed, quiet=True),
                lambda seed: generate_rmat(8, 4, 4, num_classes=3, seed=seed, quiet=True)):
        a, again, b = draw(gen, 1), draw(gen, 1), draw(gen, 2)
        assert all(np.array_equal(u, v) for u, v in zip(a, again))
        assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[2], b[2])
    for gen in (lambda seed: generate_sbm(300, 3, 4, avg_degree=6, seed=seed, quiet=True),
                lambda seed: generate_rmat(8, 4, 4, num_classes=3, seed=seed, quiet=True)):
        assert not np.array_equal(draw(gen, 1)[1], draw(gen, 2)[1])


def test_config_from_the_command_line():
    # one frozen PrepareConfig, built right after parsing: options not given take the dataclasses' defaults, and
    # no function below main sees the argparse namespace
    import dataclasses
    from pathlib import Path

    from data_tools.cli import config_from, prepare_parser as build_parser
    from data_tools.prepare import EdgelistSource, PrepareConfig, RmatSource, SbmSource

    def config(*argv):
        return config_from(build_parser().parse_args([*map(str, argv), "--out", "g.h5"]))
    cfg = config("sbm", "--nodes", 300, "--homophily", 0.9, "--symmetrize", "--seed", 4, "--val", 0.1, "-q")
    assert cfg.source == SbmSource(nodes=300, homophily=0.9) and cfg.out == Path("g.h5")
    assert cfg.options == common.PrepareOptions(symmetrize=True, val=0.1, seed=4, quiet=True)
    assert (cfg.source.homophily, cfg.source.noise, cfg.source.feature_dim) == (0.9, 0.5, 64)
    assert config("rmat", "--scale", 5).source == RmatSource(scale=5, edge_factor=16, feature_dim=32, classes=16,
                                                             noise=1.0)
    cfg = config("edgelist", "e.txt", "--no-header", "--node-ids", "ids.npy", "--self-loops", "drop")
    assert cfg.source == EdgelistSource(input=Path("e.txt"), header=False, node_ids=Path("ids.npy"))
    assert (cfg.source.delimiter, cfg.source.feature_dim, cfg.options.self_loops) == ("auto", 0, "drop")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.out = Path("other.h5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.source.input = Path("other.txt")
    # the checks of the options together: the same messages as g3-prepare prints (exit 2)
    with pytest.raises(ValueError, match=r"^--train and --val must be fractions with train \+ val <= 1 "
                                         r"\(got 0\.9, 0\.5\)$"):
        config("sbm", "--train", 0.9, "--val", 0.5)
    with pytest.raises(ValueError, match=r"^--seed must be >= 0"):
        PrepareConfig(source=SbmSource(), out=Path("g.h5"), options=common.PrepareOptions(seed=-1))


@pytest.mark.parametrize("kind", ["sbm", "rmat", "edgelist"])
def test_help_names_every_default(kind):
    """Each generator option's --help says its default, the value the dataclass gives (PREPARE.md documents them;
    the help of sbm's --nodes, --classes, --feature-dim and of rmat's options said nothing)."""
    import dataclasses

    from data_tools.cli import prepare_parser as build_parser
    from data_tools.prepare import SOURCES

    sub = next(a for a in build_parser()._actions if a.dest == "kind").choices[kind]
    helps = {a.dest: " ".join((a.help or "").split()) for a in sub._actions}
    for f in dataclasses.fields(SOURCES[kind]):
        if f.name in helps and f.default not in (None, dataclasses.MISSING) and f.name not in ("delimiter", "header"):
            words = {f"default {f.default}"} | ({f"default {f.default:g}"} if isinstance(f.default, float) else set())
            assert any(w in helps[f.name] for w in words), (kind, f.name, helps[f.name])
    if kind == "sbm":
        assert "default 10" in helps["avg_degree"]


def test_split_fractions_of_an_input_with_its_own_split_are_named(tmp_path):
    """--train / --val apply only when the input has no split (PREPARE.md); given for an input with masks (Cora's
    public split) they were ignored without a word. Now a warning says so; the input's split is kept."""
    ei = np.array([[0, 1, 2], [1, 2, 0]])
    masks = dict(train_mask=np.array([1, 0, 0], bool), val_mask=np.array([0, 1, 0], bool),
                 test_mask=np.array([0, 0, 1], bool))
    f = tmp_path / "g.npz"
    np.savez(f, edge_index=ei, x=np.ones((3, 2), np.float32), y=np.array([0, 1, 0]), **masks)
    p = run_module("data_tools.prepare", "npz", f, "--out", tmp_path / "g.h5", "--train", "0.5", "--quiet")
    assert "g3-prepare: warning: " in p.stderr and "--train" in p.stderr and "its own split" in p.stderr, p.stderr
    g = load_graph(tmp_path / "g.h5")
    np.testing.assert_array_equal(g.train_mask, masks["train_mask"])
    p = run_module("data_tools.prepare", "npz", f, "--out", tmp_path / "h.h5", "--quiet")
    assert "warning" not in p.stderr                   # no fractions given: nothing to say
