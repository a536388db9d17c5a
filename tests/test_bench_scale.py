"""The scale benchmark's plumbing on a small R-MAT: every stage runs, each rank's peak RSS is measured from
outside the tool, and the quality table is the partitions' own."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import mpiexec, run_module, tool_env

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_scale_benchmark_small",)


def test_peak_rss_records_the_child_and_passes_its_status(tmp_path):
    """A child touching 200 MiB is recorded above that (below a generous bound), and its exit status is ours."""
    code = "import sys; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); sys.exit(3)"
    p = run_module("data_tools.peak_rss", tmp_path / "rss", sys.executable, "-c", code, check=False)
    assert p.returncode == 3, p.stderr
    (rec,) = [json.loads(f.read_text()) for f in (tmp_path / "rss").glob("*.json")]
    assert rec["returncode"] == 3 and 200 << 20 <= rec["peak_rss_bytes"] < 400 << 20, rec


def test_peak_rss_one_record_per_rank_under_mpiexec(tmp_path):
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "data_tools.peak_rss", str(tmp_path / "rss"), sys.executable,
           "-m", "mpi4py", "-c", "from mpi4py import MPI; assert MPI.COMM_WORLD.size == 3"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(f.read_text()) for f in (tmp_path / "rss").glob("*.json")]
    assert len({r["pid"] for r in recs}) == 3 and all(r["returncode"] == 0 for r in recs), recs


def test_scale_benchmark_small(tmp_path):
    out = tmp_path / "scale.json"
    p = run_module("data_tools.bench_scale", "--scale", 9, "--parts", 4, "--ranks", 2, "--train-ranks", 2,
                   "--epochs", 1, "--metis", "on", "--work", tmp_path / "w", "--out", out, timeout=600)
    rec = json.loads(out.read_text())
    names = [s["stage"] for s in rec["stages"]]
    assert names == ["prepare", "partition-stream", "partition-metis", "partition-train", "train"], names
    for s in rec["stages"]:
        assert len(s["peak_rss_bytes"]) == s["ranks"] and min(s["peak_rss_bytes"]) > 10 << 20, s
        assert s["peak_rss_bytes_sum"] == sum(s["peak_rss_bytes"]) and s["bytes_written"] > 0, s
    assert [s["ranks"] for s in rec["stages"]] == [1, 2, 1, 2, 2]
    assert rec["graph"]["num_nodes"] == 512
    prep = json.loads((tmp_path / "w" / "graph.h5.prepare.json").read_text())   # its stages reset VmHWM
    assert rec["stages"][0]["peak_rss_bytes"][0] >= prep["total"]["peak_rss_bytes"]
    stream, metis, ratio = rec["quality"]
    for q, d in ((stream, "parts-stream-4"), (metis, "parts-metis-4")):
        meta = json.loads((tmp_path / "w" / d / "meta.json").read_text())
        assert q["edge_cut"] == meta["quality"]["edge_cut"] and q["max_comm_rows"] == meta["quality"]["max_comm_rows"]
    assert ratio["edge_cut"] == round(stream["edge_cut"] / metis["edge_cut"], 3)
    summary = json.loads((tmp_path / "w" / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 1
    assert "partition-stream" in p.stdout and "stream / metis" in p.stdout
