"""g3-partition on bad input and failures: one line naming the file, non-zero exit, nothing left behind (a bad
graph, an output it must not replace, a full disk, a failing or out-of-memory library, a signal)."""
from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest

from tests.partition_graphs import assert_fails, partition, random_graph, write
from data_tools.partition import main as partition_main
from g3mpi.format import array_sha256, part_name, read_meta

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_a_failing_partitioning_library_is_one_line", "test_corrupt_graph_checksum",
              "test_force_replaces_only_a_partition", "test_missing_graph", "test_output_exists_without_force",
              "test_output_would_overwrite_the_input", "test_partition_killed_outright_its_leftover_goes_next_time",
              "test_partition_on_a_full_disk", "test_partition_refuses_features_beyond_float32",
              "test_partition_sigterm_lost_in_a_callback_still_stops",
              "test_partition_terminated_by_a_signal_leaves_nothing", "test_partitioning_out_of_memory_is_one_line",
              "test_parts_above_nodes", "test_parts_below_one", "test_truncated_graph")


def test_missing_graph(tmp_path):
    p = partition(tmp_path / "nope.h5", tmp_path / "out", 2, "metis", check=False)
    assert_fails(p, "nope.h5", "no such file")
    assert not (tmp_path / "out").exists()


def test_truncated_graph(rand_h5, tmp_path):
    _, path = rand_h5
    bad = tmp_path / "trunc.h5"
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    p = partition(bad, tmp_path / "out", 2, "metis", check=False)
    assert_fails(p, "trunc.h5", "")
    assert not (tmp_path / "out").exists()


def test_corrupt_graph_checksum(rand_h5, tmp_path):
    _, path = rand_h5
    bad = tmp_path / "corrupt.h5"
    bad.write_bytes(path.read_bytes())
    with h5py.File(bad, "r+") as f:
        x = f["features"][()]
        x[3, 1] += 1.0
        f["features"][...] = x
    p = partition(bad, tmp_path / "out", 2, "random", check=False)
    assert_fails(p, "corrupt.h5", "checksum")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("parts", [0, -3])
def test_parts_below_one(parts, rand_h5, tmp_path):
    _, path = rand_h5
    p = partition(path, tmp_path / "out", parts, "metis", check=False)
    assert p.returncode != 0 and "--parts" in p.stderr
    assert not (tmp_path / "out").exists()


def test_parts_above_nodes(rand_h5, tmp_path):
    g, path = rand_h5
    p = partition(path, tmp_path / "out", g.num_nodes + 1, "random", check=False)
    assert_fails(p, "rand.h5", "--parts must be <= N")
    assert not (tmp_path / "out").exists()


def test_output_exists_without_force(rand_h5, tmp_path):
    _, path = rand_h5
    out = tmp_path / "out"
    out.mkdir()
    p = partition(path, out, 2, "metis", check=False)
    assert_fails(p, "out", "output already exists (use --force")
    partition(path, out, 2, "metis", None, 0, "--force")  # an empty directory is replaced
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    p = partition(path, out, 3, "metis", check=False)
    assert_fails(p, "out", "output already exists (use --force")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out"], "nothing left behind"
    partition(path, out, 3, "metis", None, 0, "--force")  # an earlier partition is replaced
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 3
    assert sorted(f.name for f in out.iterdir()) == ["meta.json", "node_map.h5", *(part_name(i) for i in range(3))]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out"]


def test_force_replaces_only_a_partition(rand_h5, tmp_path):
    """--force replaces a partition directory (one with meta.json) or an empty directory, never a directory or
    file of the user's that --out named by mistake (before, `--out ~/results --force` deleted ~/results with
    everything in it, and a file was replaced by the partition)."""
    _, path = rand_h5
    mine = tmp_path / "results"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "sub" / "meta.json").write_text("{}")          # a meta.json deeper down does not make it a partition
    afile = tmp_path / "afile"
    afile.write_text("mine too")
    for out, why in ((mine, "is a directory with no meta.json (not one this tool wrote) and not empty"),
                     (afile, "is a file, not an output directory")):
        for force in ((), ("--force",)):
            p = partition(path, out, 2, "metis", None, 0, *force, check=False)
            assert p.stderr.strip().splitlines()[-1] == (f"g3-partition: error: {out}: {why}: not replaced, even "
                                                         f"with --force (remove it yourself or choose another output)")
            assert p.returncode == 1 and "Traceback" not in p.stderr
    assert (mine / "notes.txt").read_text() == "mine" and (mine / "sub" / "meta.json").read_text() == "{}"
    assert sorted(f.name for f in mine.iterdir()) == ["notes.txt", "sub"] and afile.read_text() == "mine too"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["afile", "results"], "nothing left behind"


def test_output_would_overwrite_the_input(rand_h5, tmp_path, monkeypatch):
    """--out naming the input, a link to it or a directory holding it is refused even with --force: before, the
    graph was replaced by the partition directory (or deleted with the directory around it)."""
    _, path = rand_h5
    d = tmp_path / "d"
    d.mkdir()
    graph = d / "g.h5"
    graph.write_bytes(path.read_bytes())
    (tmp_path / "link.h5").symlink_to(graph)
    monkeypatch.chdir(d)
    for inp, out, what in ((graph, graph, ""), (tmp_path / "link.h5", graph, ""), (graph, tmp_path / "link.h5", ""),
                           (graph, d, "lies inside it"), ("g.h5", ".", "lies inside it"),
                           ("g.h5", "..", "lies inside it")):
        p = partition(inp, out, 2, "metis", None, 0, "--force", check=False)
        assert_fails(p, str(out), "output would overwrite the input")
        assert what in p.stderr
        assert graph.read_bytes() == path.read_bytes()
    assert sorted(f.name for f in d.iterdir()) == ["g.h5"]
    (tmp_path / "e").mkdir()
    p = partition(graph, ".", 2, "metis", None, 0, "--force", check=False, cwd=tmp_path / "e")
    assert_fails(p, ".", "name the output directory itself")             # was an OSError traceback


def test_partition_refuses_features_beyond_float32(tmp_path):
    """A graph file's float64 features that overflow float32 (1e300): g3-partition stops naming the graph and
    the node, instead of writing parts the runtime refuses (their features would be Inf); nothing is left."""
    g = random_graph(n=60, m=200, seed=5)
    write(g, tmp_path / "g.h5")
    with h5py.File(tmp_path / "g.h5", "r+") as f:
        x = f["features"][()].astype(np.float64)
        x[17, 2] = 1e300
        del f["features"]
        ds = f.create_dataset("features", data=x)
        ds.attrs["sha256"] = array_sha256(x)
    p = partition(tmp_path / "g.h5", tmp_path / "parts", 2, "random", check=False)
    assert p.returncode == 1
    assert "g.h5: features of node 17 are not finite as float32" in p.stderr
    assert not (tmp_path / "parts").exists()


def test_partition_on_a_full_disk(cora_h5, tmp_path):
    """Writes that fail (here a file size limit, as a full disk does): one line naming the output and the
    reason, exit 1, nothing left behind. Before: an h5py traceback, then a segfault at exit (status 139)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (600 * 1024, resource.RLIM_INFINITY))
    _, path = cora_h5
    p = partition(path, tmp_path / "parts", 3, "random", check=False, preexec_fn=limit)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"g3-partition: error: {tmp_path / 'parts'}: cannot be written: " \
                                                "File too large"
    assert "Traceback" not in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == []


SCALE_HINT = "for graphs this large use the parallel path: mpiexec -n R g3-partition --method stream ..."


def _partition_patched(patch: str, graph_path, out, method):
    """The g3-partition command (its own main, argv from the command line) after ``patch`` (Python code) ran."""
    import subprocess
    import sys
    from tests.conftest import tool_env
    code = f"import os, sys\n{patch}from data_tools.partition import main\nsys.exit(main())\n"
    return subprocess.run([sys.executable, "-c", code, str(graph_path), "--parts", "3", "--method", method,
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, env=tool_env(),
                          timeout=120)


@pytest.mark.parametrize("method", ["metis", "g3"])
def test_a_failing_partitioning_library_is_one_line(method, rand_h5, tmp_path):
    """pymetis failing as it did after 29 minutes on a 67M-edge R-MAT (``RuntimeError: Caught an unknown
    exception!``, a traceback): one line naming the graph, the method, the graph's size, the exception and what
    METIS printed, with the hint to the parallel path; exit 1, nothing written, nothing on stdout."""
    g, path = rand_h5
    patch = ("import pymetis\n"
             "def part_graph(*a, **k):\n"
             "    os.write(1, b'***Memory allocation failed for SetupCtrl: ctrl->tpwgts.\\n')\n"
             "    raise RuntimeError('Caught an unknown exception!')\n"
             "pymetis.part_graph = part_graph\n")
    p = _partition_patched(patch, path, tmp_path / "parts", method)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "Memory" not in p.stdout, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert re.fullmatch(re.escape(f"g3-partition: error: {path}: --method {method}: METIS failed after ") +
                        r"\d+ s on 300 nodes, \d+ symmetric adjacency entries: " +
                        re.escape("RuntimeError: Caught an unknown exception! (METIS said: Memory allocation "
                                  f"failed for SetupCtrl: ctrl->tpwgts.); {SCALE_HINT}"), line), line
    assert sorted(f.name for f in tmp_path.iterdir()) == []


def test_partitioning_out_of_memory_is_one_line(rand_h5, tmp_path):
    """A MemoryError in a partitioner's own library calls (numpy here): the line names the graph and the method
    and gives the hint; exit 1, nothing written."""
    _, path = rand_h5
    patch = ("import data_tools.partitioners as partitioners\n"
             "def random_partition(*a, **k):\n"
             "    raise MemoryError\n"
             "partitioners.random_partition = random_partition\n")
    p = _partition_patched(patch, path, tmp_path / "parts", "random")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (f"g3-partition: error: {path}: out of memory (--method random); "
                                                 f"{SCALE_HINT}")
    assert sorted(f.name for f in tmp_path.iterdir()) == []


def test_graph_beyond_metis_idx_is_refused_up_front(rand_h5, tmp_path, monkeypatch, capsys):
    """A graph whose adjacency or summed vertex weights this pymetis's idx_t cannot count is refused before METIS
    runs (this build's idx_t is 64-bit; an 8-bit one stands in for a 32-bit build with a graph beyond 2^31
    entries)."""
    import pymetis
    from data_tools.partitioners.metis import MetisError, check_idx_range
    _, path = rand_h5

    def part_graph(*a, **k):
        raise AssertionError("METIS ran")
    monkeypatch.setattr(pymetis, "zero_copy_dtype", lambda: np.dtype(np.int8))
    monkeypatch.setattr(pymetis, "part_graph", part_graph)
    assert partition_main([str(path), "--parts", "3", "--method", "metis", "--out", str(tmp_path / "parts"),
                           "--no-progress"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(re.escape(f"g3-partition: error: {path}: --method metis: the graph (300 nodes, ") +
                        r"\d+ symmetric adjacency entries\) " +
                        re.escape(f"is too large for this METIS build: its adjacency entries exceed the 8-bit idx_t "
                                  f"(at most 127); {SCALE_HINT}"), line), line
    assert sorted(f.name for f in tmp_path.iterdir()) == []
    check_idx_range(127, 127, "s")
    with pytest.raises(MetisError, match=r"its summed vertex weights exceed the 8-bit idx_t \(at most 127\)"):
        check_idx_range(10, 128, "s")


def _partition_killed_by(signum, graph_path, out):
    """g3-partition, its own code, sending itself ``signum`` while the part files are being filled (after
    every other dataset is written), as a batch system's time limit or scancel would."""
    import subprocess
    import sys
    from tests.conftest import tool_env
    code = ("import os, sys; from data_tools import build; "
            "build.FEATURE_BLOCK_BYTES = 0; "   # Cora's features would be written with each part, not streamed
            f"build.stream_features = lambda *a, **k: os.kill(os.getpid(), {int(signum)}); "
            "from data_tools.partition import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, str(graph_path), "--parts", "3", "--method", "random",
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, env=tool_env(),
                          timeout=120)


@pytest.mark.parametrize("signum", [15, 1])
def test_partition_terminated_by_a_signal_leaves_nothing(cora_h5, tmp_path, signum):
    """SIGTERM (a batch job's time limit, scancel) or SIGHUP while writing: the command says so, exits
    128 + the signal, and the half-written partition's hidden temporary directory is removed. Before, Python's
    default action ended the process at once and the temporary (gigabytes on a large graph) stayed."""
    import signal
    _, path = cora_h5
    p = _partition_killed_by(signum, path, tmp_path / "parts")
    name = signal.Signals(signum).name
    assert p.returncode == 128 + signum, p.stderr
    assert p.stderr.strip().splitlines()[-1] == \
        f"g3-partition: error: {tmp_path / 'parts'}: terminated by {name} (no output written)"
    assert sorted(f.name for f in tmp_path.iterdir()) == []


def test_partition_killed_outright_its_leftover_goes_next_time(cora_h5, tmp_path):
    """SIGKILL (KillWait passed, the out-of-memory killer) cannot be caught: the temporary directory stays,
    named after its host and process, and the next g3-partition to the same output removes it, saying so."""
    _, path = cora_h5
    p = _partition_killed_by(9, path, tmp_path / "parts")
    assert p.returncode == -9
    left = [f.name for f in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".parts.") and left[0].endswith(".tmp"), left
    assert any((tmp_path / left[0]).iterdir())
    p = partition(path, tmp_path / "parts", 3, "random")
    assert f"removed {left[0]}, left by process" in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["parts"]
    assert read_meta(tmp_path / "parts")["num_parts"] == 3


def test_partition_sigterm_lost_in_a_callback_still_stops(cora_h5, tmp_path):
    """A SIGTERM handled inside a weakref callback or __del__ raises where Python only prints 'Exception ignored'
    and carries on; the directory must still not be committed (write_partition re-raises it, as g3-prepare's
    writer does). The signal is sent from inside a finalizer while a part file is written."""
    import subprocess
    import sys
    from tests.conftest import tool_env
    code = ("import os, signal, sys, weakref\n"
            "from data_tools import build\n"
            "orig = build.write_part\n"
            "class Obj: pass\n"
            "def write_part(*a, **k):\n"
            "    o = Obj()\n"
            "    weakref.finalize(o, lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
            "    del o\n"
            "    return orig(*a, **k)\n"
            "build.write_part = write_part\n"
            "from data_tools.partition import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    _, path = cora_h5
    out = tmp_path / "parts"
    p = subprocess.run([sys.executable, "-c", code, str(path), "--parts", "3", "--method", "random", "--out",
                        str(out), "--no-progress"], capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 143, p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"g3-partition: error: {out}: terminated by SIGTERM (no output written)"
    assert "Exception ignored" not in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == []
