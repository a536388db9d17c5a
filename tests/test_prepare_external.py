"""g3-prepare's out-of-core build (docs/PREPARE.md, Memory): forced on small graphs by a tiny --memory-budget, it
writes the same graph.h5 as the in-memory build, dataset for dataset and attribute for attribute; the stage record;
R-MAT's blocked generator."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json

import h5py
import numpy as np
import pytest

from data_tools import cli, prepare as prep
from data_tools.importers import rmat
from data_tools.importers.common import BLOCK_BYTES_PER_EDGE
from tests.test_prepare_importers import make_ogb

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_stage_meter_peak_is_per_stage",)

#: a budget of 12 edges per sort: every graph below goes out of core, in many buckets, most of them split
TINY = str(12 * BLOCK_BYTES_PER_EDGE)


def run(*args) -> dict:
    """g3-prepare in this process (many small runs); its JSON summary."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = prep.main([str(a) for a in args] + ["--quiet"])
    assert rc == 0, e.getvalue()
    return json.loads(o.getvalue().strip().splitlines()[-1])


def assert_same_file(a, b):
    """Every dataset of the two graph.h5 files: dtype, shape, chunking, values and attributes; the file attributes
    but `source` (it names the input)."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert sorted(fa.keys()) == sorted(fb.keys())
        for k in fa:
            da, db = fa[k], fb[k]
            assert (da.dtype, da.shape, da.chunks) == (db.dtype, db.shape, db.chunks), k
            np.testing.assert_array_equal(da[()], db[()], err_msg=k)
            assert dict(da.attrs) == dict(db.attrs), k
        assert dict(fa.attrs) == dict(fb.attrs)


def both_ways(tmp_path, *args):
    """Prepare with the default budget (in memory) and with TINY (out of core); compare; return the summaries."""
    mem = run(*args, "--out", tmp_path / "mem.h5")
    ext = run(*args, "--out", tmp_path / "ext.h5", "--memory-budget", TINY)
    assert (mem["build"], ext["build"]) == ("in-memory", "out-of-core")
    assert ext["block_edges"] == 12
    assert_same_file(tmp_path / "mem.h5", tmp_path / "ext.h5")
    assert mem["num_edges"] == ext["num_edges"] > 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == [], left                              # no work directory, spill or bucket file left behind
    return mem, ext


GRAPH_OPTIONS = [(), ("--symmetrize",), ("--dedup",), ("--self-loops", "drop"), ("--self-loops", "add"),
                 ("--symmetrize", "--self-loops", "add")]


@pytest.mark.parametrize("opts", GRAPH_OPTIONS)
def test_rmat_out_of_core_same_file(tmp_path, opts):
    both_ways(tmp_path, "rmat", "--scale", 8, "--edge-factor", 6, "--feature-dim", 3, "--seed", 2, *opts)


def test_sbm_out_of_core_same_file(tmp_path):
    """A generator that hands over whole arrays (and merges duplicates): the out-of-core build reads them in blocks."""
    both_ways(tmp_path, "sbm", "--nodes", 300, "--classes", 3, "--feature-dim", 2, "--avg-degree", 6, "--self-loops",
              "add")


@pytest.mark.parametrize("opts", GRAPH_OPTIONS[:3])
def test_edgelist_out_of_core_same_file(tmp_path, opts):
    rng = np.random.default_rng(5)
    ids = rng.choice(10**12, size=150, replace=False) - 5 * 10**11       # sparse, negative, 64-bit IDs
    e = ids[rng.integers(0, 150, size=(700, 2))]
    e[::50, 1] = e[::50, 0]                                              # a few self loops
    lines = ["# comment"] + [f"{u}\t{v}\t1.5" for u, v in e]
    (tmp_path / "e.tsv").write_text("\n".join(lines) + "\n")
    mem, ext = both_ways(tmp_path, "edgelist", tmp_path / "e.tsv", "--feature-dim", 4, *opts)
    with h5py.File(tmp_path / "ext.h5", "r") as f:
        assert set(f["orig_ids"][()].tolist()) == set(e.reshape(-1).tolist())


def test_edgelist_node_ids_out_of_core_same_file(tmp_path):
    rng = np.random.default_rng(6)
    ids = rng.permutation(400) * 7 + 3
    e = ids[rng.integers(0, 400, size=(900, 2))]
    (tmp_path / "e.txt").write_text("".join(f"{u} {v}\n" for u, v in e))
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 400))
    both_ways(tmp_path, "edgelist", tmp_path / "e.txt", "--labels", tmp_path / "y.npy", "--node-ids",
              tmp_path / "ids.npy", "--symmetrize")


@pytest.mark.parametrize("opts", GRAPH_OPTIONS[:2])
def test_ogb_out_of_core_same_file(tmp_path, opts):
    make_ogb(tmp_path / "d", n=200, f=3)
    both_ways(tmp_path, "ogb", tmp_path / "d", *opts)


def test_stage_record(tmp_path):
    s = run("rmat", "--scale", 6, "--edge-factor", 4, "--feature-dim", 2, "--out", tmp_path / "g.h5",
            "--memory-budget", "1K")
    rec = json.loads((tmp_path / "g.h5.prepare.json").read_text())
    assert s["record"] == str(tmp_path / "g.h5.prepare.json")
    names = [r["stage"] for r in rec["stages"]]
    assert names == [r["stage"] for r in s["stages"]] == ["read", "edges", "csr", "features", "nodes"]
    assert rec["build"] == "out-of-core" and rec["num_edges"] == 256 and rec["memory_budget"] == 1024
    for r in rec["stages"]:
        assert r["seconds"] >= 0 and r["peak_rss_bytes"] > 10 << 20 and r["bytes_written"] >= 0
    assert rec["stages"][1]["bytes_written"] >= 256 * 8          # the buckets: one (dst, src) int32 pair per edge
    assert rec["total"]["peak_rss_bytes"] == max(r["peak_rss_bytes"] for r in rec["stages"])


def test_stage_meter_peak_is_per_stage():
    """A stage that allocates 200 MiB reports it; the next one, after it is freed, reports less (VmHWM reset)."""
    from data_tools.stages import StageMeter
    m = StageMeter()
    with m.stage("big"):
        a = np.ones(200 << 17)            # 200 MiB of float64, touched
        del a
    with m.stage("small"):
        pass
    big, small = m.records
    assert big["peak_rss_bytes"] - small["peak_rss_bytes"] > 150 << 20 or small["peak_rss_source"] != "VmHWM"


@pytest.mark.parametrize("bad", ["--memory-budget=0", "--memory-budget=lots", "--memory-budget=-1G"])
def test_bad_memory_budget(tmp_path, bad, capsys):
    try:
        rc = prep.main(["rmat", "--scale", "4", "--out", str(tmp_path / "g.h5"), bad])
    except SystemExit as e:                # argparse: not a size
        rc = e.code
    assert rc == 2
    assert "--memory-budget" in capsys.readouterr().err
    assert not (tmp_path / "g.h5").exists()


def test_parse_size():
    assert [cli.parse_size(t) for t in ("4096", "512M", "2G", "1.5k", "3GiB", "1T")] == \
        [4096, 512 << 20, 2 << 30, 1536, 3 << 30, 1 << 40]


def test_rmat_blocks_unchanged_for_existing_seeds():
    """The blocked generator draws the scrambling permutation first (skipping ahead in the stream) yet yields the
    edges of the generator that drew it after all of them: the sha256 below is that generator's output
    (data_tools/importers/rmat.py before blocking) for scale 6, edge factor 9, seed 3."""
    s, d = rmat.rmat_edges(6, 9, seed=3, quiet=True)
    assert hashlib.sha256(s.tobytes() + d.tobytes()).hexdigest() == \
        "51da229c2f2d574090189a5aeb84d7f31bc2477eb3ff7761808af9ba1b917931"


@pytest.mark.parametrize("chunk", [7, 8, 64])
def test_rmat_skip_ahead_any_block(monkeypatch, chunk):
    """With any generation block (odd or even sizes, a short last block), the blocks equal one unscrambled stream
    mapped through the permutation that the same generator draws after it."""
    monkeypatch.setattr(rmat, "EDGE_CHUNK", chunk)
    s, d = rmat.rmat_edges(5, 3, seed=1, quiet=True)
    u, v = rmat.rmat_edges(5, 3, seed=1, scramble=False, quiet=True)
    g = np.random.default_rng(np.random.SeedSequence([1, 0x12A7]))
    for k0 in range(0, 3 * 32, chunk):
        for _ in range(5):
            g.integers(0, 1 << 16, size=min(chunk, 96 - k0), dtype=np.uint16)
    perm = g.permutation(32)
    np.testing.assert_array_equal(s, perm[u])
    np.testing.assert_array_equal(d, perm[v])


def fail(*args) -> str:
    """g3-prepare in this process, expected to fail with one line on stderr: that line."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = prep.main([str(a) for a in args] + ["--quiet"])
    lines = e.getvalue().strip().splitlines()
    assert rc == 1 and len(lines) == 1, e.getvalue()
    return lines[0]


@pytest.mark.parametrize("case", ["rows", "node_ids", "ogb"])
def test_bad_id_in_a_late_block(tmp_path, monkeypatch, case):
    """An out-of-range ID in a later block of a spooled (on-disk) edge list: the message names the file and the
    line, as with the whole list in memory, and nothing is left behind."""
    from data_tools.importers import textio
    monkeypatch.setattr(textio, "CHUNK_BYTES", 1000)      # after a first chunk of 4096 lines, chunks of 256
    rng = np.random.default_rng(7)
    e = rng.integers(0, 200, size=(6000, 2))
    e[5500, 1] = 999
    if case == "ogb":
        make_ogb(tmp_path / "d", n=200, f=3)
        import gzip
        with gzip.open(tmp_path / "d" / "raw" / "edge.csv.gz", "wt") as f:
            f.write("".join(f"{u},{v}\n" for u, v in e))
        args = ["ogb", tmp_path / "d"]
        where = f"{tmp_path / 'd' / 'raw' / 'edge.csv.gz'}: line 5501: node ID 999 out of range [0, 200)"
    else:
        (tmp_path / "e.txt").write_text("# edges\n" + "".join(f"{u} {v}\n" for u, v in e))
        np.save(tmp_path / "y.npy", rng.integers(0, 3, 200))
        args = ["edgelist", tmp_path / "e.txt", "--labels", tmp_path / "y.npy"]
        if case == "node_ids":
            np.save(tmp_path / "ids.npy", np.arange(200))
            args += ["--node-ids", tmp_path / "ids.npy"]
        where = f"{tmp_path / 'e.txt'}: line 5502: node ID 999 " + \
            (f"is not in {tmp_path / 'ids.npy'}" if case == "node_ids" else "out of range [0, 200)")
    before = sorted(p.name for p in tmp_path.iterdir())
    mem = fail(*args, "--out", tmp_path / "g.h5")
    ext = fail(*args, "--out", tmp_path / "g.h5", "--memory-budget", "1K")
    assert mem == ext and mem.startswith(f"g3-prepare: error: {where}"), (mem, ext)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
