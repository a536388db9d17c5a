"""g3-partition --method kaminpar, --refine g3, --method auto, and serial methods under mpiexec (one writer)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from data_tools import cli, partition as partition_tool
from data_tools.inspection import inspect_path
from data_tools.partitioners.kaminpar import write_parhip
from g3mpi.format import read_meta, read_node_map
from tests.conftest import mpiexec, run_module, tool_env
from tests.partition_graphs import assert_as_serial_writer, assert_fails, expected_edges, partition, reassemble

pytest.importorskip("kaminpar", reason="the kaminpar package (setup.py's test extra) is not installed")

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_kaminpar_reassembly_exact", "test_serial_methods_under_mpiexec_one_writer",
              "test_serial_failure_under_mpiexec_one_line", "test_missing_kaminpar_one_line",
              "test_refine_any_start_holds_caps", "test_auto_metis_check_keeps_the_fewer_rows")
PS = (1, 2, 3, 4, 7)


@pytest.mark.parametrize("which", ["cora", "rand"])
def test_kaminpar_reassembly_exact(which, cora_h5, rand_h5, tmp_path):
    """Cora is stored symmetric (its rows go to KaMinPar as they are), the random graph directed with self loops
    (symmetrized first): the parts hold exactly the input for every P."""
    g, path = cora_h5 if which == "cora" else rand_h5
    want_src, want_dst = expected_edges(g)
    for P in PS:
        out = tmp_path / f"p{P}"
        partition(path, out, P, "kaminpar", None, 0, "--threads", "1", inproc=True)
        src, dst, feats, labels, masks = reassemble(out)
        assert np.array_equal(src, want_src) and np.array_equal(dst, want_dst), f"edges differ for P={P}"
        assert np.array_equal(feats, g.features) and np.array_equal(labels, g.labels)
        for k, m in masks.items():
            assert np.array_equal(m, getattr(g, k)), k
        meta = read_meta(out)
        assert meta["method"] == "kaminpar" and meta["num_parts"] == P
        assert P == 1 or (meta["kaminpar_context"] == "default" and meta["kaminpar_threads"] == 1)
        owned = [p["owned"] for p in inspect_path(out)["parts"]]
        assert min(owned) > 0 and sum(owned) == g.num_nodes


def test_write_parhip_blocks(tmp_path):
    """The ParHIP file: header, byte-address offsets, neighbours without self loops or repeats, node weights;
    the same bytes whatever the block size."""
    indptr = np.array([0, 3, 5, 5, 8], dtype=np.int64)
    indices = np.array([1, 1, 3, 0, 1, 0, 1, 3], dtype=np.int32)   # row 0: 1 twice; row 1: self loop; row 3 too
    files = []
    for block in (1, 2, 100):
        path = tmp_path / f"g{block}.parhip"
        n, m = write_parhip(path, indptr, indices, np.array([5, 6, 7, 8]), block_entries=block)
        assert (n, m) == (4, 5)
        files.append(path.read_bytes())
    assert files[0] == files[1] == files[2]
    words = np.frombuffer(files[0][:64], dtype=np.uint64)
    assert words[:3].tolist() == [9, 4, 5]        # 32-bit node IDs, 64-bit offsets and weights; no edge weights
    base = 24 + 8 * 5
    assert ((words[3:8] - base) // 4).tolist() == [0, 2, 3, 3, 5]
    assert np.frombuffer(files[0][base:base + 20], dtype=np.uint32).tolist() == [1, 3, 0, 0, 1]
    assert np.frombuffer(files[0][base + 20:], dtype=np.uint64).tolist() == [5, 6, 7, 8]


def test_write_parhip_simple_rows_as_they_are(tmp_path):
    """Rows without self loops or repeats (the caller counted the loops) are written in one pass: the same bytes
    as the checked path; a repeat or a loop in the rows takes the checked path whatever the caller says."""
    rng = np.random.default_rng(3)
    n = 50
    rows = [np.unique(rng.integers(0, n, rng.integers(0, 9))) for _ in range(n)]
    rows = [r[r != v] for v, r in enumerate(rows)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.concatenate(rows).astype(np.int32)
    w = np.arange(1, n + 1)
    for block in (3, 100):
        write_parhip(tmp_path / "checked", indptr, indices, w, block_entries=block)
        write_parhip(tmp_path / "simple", indptr, indices, w, block_entries=block, self_loops=np.zeros(n, np.int64))
        assert (tmp_path / "checked").read_bytes() == (tmp_path / "simple").read_bytes()
    rep_ptr, rep = np.array([0, 2, 3]), np.array([1, 1, 0], dtype=np.int32)   # row 0 lists 1 twice
    write_parhip(tmp_path / "r", rep_ptr, rep, None, self_loops=np.zeros(2, np.int64))
    assert np.frombuffer((tmp_path / "r").read_bytes()[:24], dtype=np.uint64)[2] == 2


def test_refined_kaminpar_gets_half_the_tolerance(cora_h5, tmp_path, monkeypatch):
    """Before a refinement KaMinPar's tolerance is half the caps' (its one weight then keeps the in-edges under
    their cap); alone it gets the caps' own. auto's phases 1 and 2 take at most AUTO_MAX_ITERS evaluations after
    KaMinPar, g3's default after METIS (no kaminpar package); --max-iters overrides both."""
    _, path = cora_h5
    partition(path, tmp_path / "r", 4, "kaminpar", None, 0, "--refine", "g3", "--threads", "1", inproc=True)
    partition(path, tmp_path / "n", 4, "kaminpar", None, 0, "--threads", "1", inproc=True)
    partition(path, tmp_path / "a", 4, "auto", None, 0, "--threads", "1", inproc=True)
    assert read_meta(tmp_path / "r")["kaminpar_imbalance"] == pytest.approx(1.05)
    assert read_meta(tmp_path / "n")["kaminpar_imbalance"] == pytest.approx(1.10)
    auto = read_meta(tmp_path / "a")
    assert auto["kaminpar_imbalance"] == pytest.approx(1.05)
    assert auto["iterations"] - auto["descent_iterations"] <= partition_tool.AUTO_MAX_ITERS
    def resolved(*args, has_kaminpar=True):
        cfg = cli.partition_args([str(path), "-p", "2", "-o", "x", *args])
        monkeypatch.setattr(partition_tool, "auto_method", lambda graph: "kaminpar" if has_kaminpar else "g3")
        return partition_tool.choose_method(cfg, None) if cfg.method == "auto" else cfg

    assert resolved().max_iters == partition_tool.AUTO_MAX_ITERS
    assert resolved(has_kaminpar=False).max_iters == 100   # g3's METIS start needs the whole refinement
    assert resolved("--max-iters", "9").max_iters == resolved("--max-iters", "9", has_kaminpar=False).max_iters == 9
    assert resolved("--method", "g3").max_iters == 100


@pytest.mark.parametrize("method", ["metis", "kaminpar"])
def test_refine_any_start_holds_caps(method, cora_h5, tmp_path):
    """--refine g3 after metis or kaminpar: both caps hold and the estimated epoch is not worse than the start's."""
    _, path = cora_h5
    out = tmp_path / method
    partition(path, out, 8, method, None, 0, "--refine", "g3", inproc=True)
    meta = read_meta(out)
    assert meta["method"] == f"{method}+g3" and meta["start"].startswith(method)
    assert meta["objective_after"] <= meta["objective_before"] + 1e-15
    r = inspect_path(out)
    owned = np.array([p["owned"] for p in r["parts"]])
    edges = np.array([p["local_edges"] for p in r["parts"]])
    assert owned.max() <= 1.10 * owned.mean() + 1 and edges.max() <= 1.10 * edges.mean() + 1e-9


def test_auto_default_and_its_choice(cora_h5, tmp_path, monkeypatch):
    """No --method: kaminpar (its default context, unless told) + g3 refinement on a graph that fits; stream where
    the estimate exceeds memory."""
    _, path = cora_h5
    partition_tool.main([str(path), "--parts", "4", "--out", str(tmp_path / "p"), "--no-progress"])
    meta = read_meta(tmp_path / "p")
    assert meta["method"] == "kaminpar+g3" and meta["violation_after"] == 0 and meta["kaminpar_context"] == "default"
    partition_tool.main([str(path), "--parts", "4", "--out", str(tmp_path / "q"), "--no-progress",
                         "--kaminpar-context", "strong"])
    assert read_meta(tmp_path / "q")["kaminpar_context"] == "strong"
    assert partition_tool.auto_method(path) == "kaminpar"
    monkeypatch.setattr(partition_tool, "available_memory", lambda: 10**6)
    assert partition_tool.auto_method(path) == "stream"


def test_auto_reproducible(cora_h5, tmp_path, monkeypatch):
    """auto at the default threads gives the same assignment twice: KaMinPar runs on one thread (on two its
    partition differs from run to run), the refinement is deterministic; the METIS check is left out here so that
    KaMinPar's own partition is compared."""
    _, path = cora_h5
    monkeypatch.setattr(partition_tool, "AUTO_METIS_CHECK_EDGES", 0)
    maps = []
    for name in ("a", "b"):
        partition_tool.main([str(path), "--parts", "4", "--out", str(tmp_path / name), "--no-progress"])
        meta = read_meta(tmp_path / name)
        assert meta["method"] == "kaminpar+g3" and meta["kaminpar_threads"] == 1 and "auto_check" not in meta
        maps.append(read_node_map(tmp_path / name, meta))
    np.testing.assert_array_equal(*maps)


def test_auto_metis_check_keeps_the_fewer_rows(cora_h5, tmp_path):
    """On a small graph auto also runs node-balanced METIS and keeps whichever partition has fewer max
    communication rows within both caps; meta.json names the one kept."""
    _, path = cora_h5
    partition_tool.main([str(path), "--parts", "8", "--out", str(tmp_path / "p"), "--no-progress"])
    meta = read_meta(tmp_path / "p")
    check, rows = meta["auto_check"], meta["quality"]["max_comm_rows"]
    assert meta["method"] == check["kept"] and rows == min(check["max_comm_rows"], check["metis_max_comm_rows"]
                                                           if check["metis_within_caps"] else rows)
    assert meta["quality"]["node_imbalance"] <= 1.10 and meta["quality"]["compute_imbalance"] <= 1.10


def test_auto_without_kaminpar_says_how_to_install(cora_h5, monkeypatch, capsys):
    """The package missing (its import fails): auto falls back to g3 and its line says pip install kaminpar."""
    _, path = cora_h5
    monkeypatch.setitem(sys.modules, "kaminpar", None)   # import kaminpar now raises ImportError
    cfg = partition_tool.choose_method(cli.partition_args([str(path), "-p", "2", "-o", "x"]), None)
    assert cfg.method == "g3" and cfg.refine == "none"
    assert "--method auto: g3 (the kaminpar package is not installed: pip install kaminpar" in capsys.readouterr().err


def test_auto_counts_a_directed_graph_twice(rand_h5, monkeypatch):
    """A graph not stored symmetric reaches KaMinPar as A + A^T: the estimate counts its edges twice."""
    import h5py
    _, path = rand_h5
    with h5py.File(path, "r") as f:
        n, e, symmetric = int(f.attrs["num_nodes"]), int(f.attrs["num_edges"]), bool(f.attrs["symmetric"])
    assert not symmetric
    between = (partition_tool.kaminpar_memory(n, e) + partition_tool.kaminpar_memory(n, 2 * e)) // 2
    monkeypatch.setattr(partition_tool, "available_memory", lambda: int(between / partition_tool.AUTO_MEMORY_SHARE))
    assert partition_tool.auto_method(path) == "stream"


@pytest.mark.parametrize("argv,what", [
    (["--method", "metis", "--kaminpar-context", "fast"], "--kaminpar-context applies to --method kaminpar or auto"),
    (["--method", "stream", "--refine", "g3"], "--refine applies to --method metis or kaminpar or auto"),
    (["--method", "kaminpar", "--threads", "0"], "--threads: must be in [1, 4096], got 0"),
    (["--method", "metis", "--max-iters", "5"], "--max-iters applies to --method g3"),
])
def test_options_refused(argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        cli.partition_args(["g.h5", "--parts", "2", "--out", "o", *argv])
    assert e.value.code == 2 and what in capsys.readouterr().err


def test_missing_kaminpar_one_line(cora_h5, tmp_path, monkeypatch):
    """Without the package: --method kaminpar is one line naming it (exit 1, nothing written); auto falls back
    to METIS + refinement."""
    _, path = cora_h5
    shadow = tmp_path / "shadow" / "kaminpar"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named kaminpar (hidden by the test)')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    p = partition(path, tmp_path / "k", 2, "kaminpar", check=False)
    assert_fails(p, str(path), "--method kaminpar: the kaminpar package is not installed")
    assert len(p.stderr.strip().splitlines()) == 2 and not (tmp_path / "k").exists(), p.stderr
    run_module("data_tools.partition", path, "--parts", 2, "--out", tmp_path / "a", "--no-progress")
    assert read_meta(tmp_path / "a")["method"] == "g3"


def mpiexec_partition(n: int, *args) -> subprocess.CompletedProcess:
    """``mpiexec -n n python -m data_tools.partition ...``: the console script's way, MPI not imported first."""
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "data_tools.partition", *map(str, args), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), timeout=180)


@pytest.mark.parametrize("method", ["metis", "random", "g3", "kaminpar"])
def test_serial_methods_under_mpiexec_one_writer(method, rand_h5, tmp_path):
    """Under mpiexec -n 3 a serial method ran on every rank, each writing the same directory: now rank 0
    partitions and writes it once (the files one process writes), and every rank exits with its status."""
    _, path = rand_h5
    out = tmp_path / "parts"
    p = mpiexec_partition(3, path, "--parts", 3, "--method", method, "--out", out)
    assert p.returncode == 0, p.stderr
    assert (p.stdout + p.stderr).count("g3-partition: wrote") == 1, p.stderr
    assert "rank 0 runs it, ranks 1..2 wait" in p.stderr
    inspect_path(out)
    meta = read_meta(out)
    assert meta["method"] == method
    assert sorted(x.name for x in tmp_path.iterdir()) == ["parts"]   # no temporary left beside it
    assert_as_serial_writer(path, out, tmp_path / "serial")


def test_serial_failure_under_mpiexec_one_line(rand_h5, tmp_path):
    """Rank 0's failure is one line, and every rank exits with its status (1)."""
    _, path = rand_h5
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    p = mpiexec_partition(3, path, "--parts", 2, "--method", "metis", "--out", out)
    assert p.returncode == 1, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("g3-partition: error:")]
    assert len(errors) == 1 and str(out) in errors[0], p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["keep.txt"]
    assert json.dumps(sorted(x.name for x in tmp_path.iterdir())) == '["mine"]'
