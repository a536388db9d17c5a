"""g3-prepare on bad input: one line on stderr naming the file (and the line), non-zero exit, nothing left behind
(outputs it must not write, bad options and generator parameters, late failures, signals, a full disk)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import run_module, tool_env
from tests.prepare_runs import cora_like, fails, make_ogb, out_dir  # noqa: F401 (out_dir: a fixture)

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_bad_option_value_named", "test_bad_split_fractions", "test_disk_full_while_writing",
              "test_features_too_large_for_float32_warn", "test_generator_bad_parameters",
              "test_no_training_nodes_warns", "test_output_directory_missing", "test_output_exists_without_force",
              "test_output_is_a_directory", "test_output_is_a_file_of_the_ogb_dataset",
              "test_output_is_an_input_option", "test_output_is_the_input",
              "test_sigterm_lost_in_a_callback_still_stops", "test_summary_into_a_closed_pipe",
              "test_terminated_by_sigterm_leaves_nothing")


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
    p = run_module("data_tools.partition", out_dir / "g.h5", "--parts", 2, "--method", "metis", "--out",
                   out_dir / "parts", "--no-progress")
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
    p = run_module("data_tools.partition", out, "--parts", 2, "--method", "metis", "--out", out_dir / "parts",
                   "--no-progress")
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
