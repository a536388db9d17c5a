"""g3-inspect: reports on graphs and partitions; every corruption of a partition is caught and named."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_module
from tests.partition_graphs import random_graph, write

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_a_closed_output_pipe_ends_the_report_quietly", "test_flipped_byte", "test_graph_corrupt",
              "test_graph_report", "test_graph_schema", "test_halo_send_inconsistency", "test_meta_files_not_a_dict",
              "test_meta_malformed_cost_model", "test_meta_wrong_version", "test_missing_part", "test_missing_path",
              "test_node_map_damaged", "test_partition_report_and_plot",
              "test_partition_totals_recomputed_from_the_graph", "test_plot_legends_and_ticks_clear_of_the_data",
              "test_plot_path_checked_first", "test_plot_width_with_many_parts", "test_plot_written_atomically",
              "test_swapped_parts", "test_swapped_parts_with_fixed_checksums", "test_truncated_part")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("insp")
    g = random_graph(n=240, m=1200, seed=11)
    write(g, d / "g.h5")
    run_module("data_tools.partition", d / "g.h5", "--parts", 4, "--method", "metis", "--out", d / "parts",
               "--no-progress")
    return g, d


def inspect(path, *args):
    return run_module("data_tools.inspection", path, *args, check=False)


def fails(p, name, what=""):
    assert p.returncode != 0, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("g3-inspect: error:"), p.stderr
    assert name in lines[0] and what in lines[0], lines[0]


def copy(parts, tmp_path):
    out = tmp_path / "parts"
    shutil.copytree(parts / "parts", out)
    return out


def test_graph_report(parts):
    g, d = parts
    p = inspect(d / "g.h5", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["num_nodes"], r["num_edges"], r["train"]) == (g.num_nodes, g.num_edges, int(g.train_mask.sum()))
    assert "num_nodes" in inspect(d / "g.h5").stdout


def test_a_closed_output_pipe_ends_the_report_quietly(parts, tmp_path):
    """``g3-inspect PARTS --json | head``: the reader goes away before the report is written. No traceback: the
    exit status of a tool ended by SIGPIPE (141), and the --plot is still drawn."""
    import subprocess
    import sys

    from tests.conftest import tool_env
    _, d = parts
    png = tmp_path / "p.png"
    proc = subprocess.Popen([sys.executable, "-m", "data_tools.inspection", str(d / "parts"), "--json", "--plot",
                             str(png)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=tool_env())
    proc.stdout.close()   # before the tool has imported its libraries, let alone written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert png.stat().st_size > 0


def test_partition_report_and_plot(parts, tmp_path):
    g, d = parts
    p = inspect(d / "parts", "--json", "--plot", tmp_path / "q.png")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for k in ("num_nodes", "num_edges", "num_parts", "edge_cut", "replication_factor", "compute_imbalance",
              "comm_imbalance", "max_comm_rows", "node_imbalance", "est_max_epoch_seconds", "parts"):
        assert k in r, k
    assert r["num_parts"] == 4 and len(r["parts"]) == 4 and r["num_nodes"] == g.num_nodes
    assert sum(s["halo"] for s in r["parts"]) == sum(s["send"] for s in r["parts"])
    assert r["max_comm_rows"] == max(s["halo"] + s["send"] for s in r["parts"])
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = inspect(d / "parts").stdout
    assert "local_edges" in table and "max_comm_rows" in table


def test_partition_totals_recomputed_from_the_graph(parts):
    """The report's edge cut, halo rows and replication factor, overall and per part, equal those counted
    straight from the graph's edges and the partition's node map: an edge u -> v is cut when u and v lie in
    different parts, and part p's halo is the distinct sources of its cut in-edges. (A mutation run found these
    figures untested: dropping the 1 + of the replication factor, or counting the first halo column as owned in
    each part's cut, passed every test.)"""
    import numpy as np

    from g3mpi.format import read_meta, read_node_map
    g, d = parts
    r = json.loads(inspect(d / "parts", "--json").stdout)
    meta = read_meta(d / "parts")
    new_to_orig = read_node_map(d / "parts", meta)
    n, P = g.num_nodes, meta["num_parts"]
    part_of = np.empty(n, dtype=np.int64)
    part_of[new_to_orig] = np.searchsorted(np.asarray(meta["offsets"]), np.arange(n), side="right") - 1
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    src = g.indices.astype(np.int64)
    cut = part_of[src] != part_of[dst]
    halo = [len(np.unique(src[cut & (part_of[dst] == p)])) for p in range(P)]
    assert [s["cut_edges"] for s in r["parts"]] == [int((cut & (part_of[dst] == p)).sum()) for p in range(P)]
    assert [s["halo"] for s in r["parts"]] == halo
    assert (r["edge_cut"], r["total_halo"]) == (int(cut.sum()), sum(halo))
    assert 0 < r["edge_cut"] < g.num_edges
    assert r["replication_factor"] == 1 + sum(halo) / n


def test_summary_totals_of_parts_in_any_order():
    """``summarize`` (g3-inspect's and g3-partition's totals) takes the maximum over every part and the sums over
    all of them, wherever the largest part is (a mutation run found max_comm_rows read from the first part passing
    every test: in the tests' partitions the first part had the most communication rows)."""
    from data_tools.build import summarize
    stats = [dict(owned=10, local_edges=20, halo=2, send=1, cut_edges=3),
             dict(owned=30, local_edges=60, halo=9, send=7, cut_edges=11),
             dict(owned=20, local_edges=40, halo=4, send=8, cut_edges=5)]
    r = summarize(stats, 60, 120)
    assert (r["max_comm_rows"], r["total_halo"], r["edge_cut"]) == (16, 15, 19)
    assert r["replication_factor"] == 1 + 15 / 60
    assert (r["node_imbalance"], r["compute_imbalance"]) == (1.5, 1.5)
    assert r["comm_imbalance"] == 16 / (31 / 3)


def test_plot_width_with_many_parts(parts, tmp_path):
    """The plot is 0.35 inch per part up to 40 parts and never wider than 16 inches (1600 px): at 200 parts it
    was 72 inches wide before."""
    import matplotlib.image
    from data_tools.inspection import inspect_path, plot_report
    g, d = parts
    for P, width in ((4, 600), (200, 1600)):
        out = tmp_path / f"p{P}"
        run_module("data_tools.partition", d / "g.h5", "--parts", P, "--method", "random", "--out", out,
                   "--no-progress")
        plot_report(inspect_path(out), tmp_path / f"p{P}.png")
        assert matplotlib.image.imread(tmp_path / f"p{P}.png").shape[1] == width


def test_missing_path(tmp_path):
    fails(inspect(tmp_path / "nothing"), "nothing", "no such file")


def test_flipped_byte(parts, tmp_path):
    out = copy(parts[1], tmp_path)
    f = out / "part-00002.h5"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    fails(inspect(out), "part-00002.h5", "checksum")


def test_truncated_part(parts, tmp_path):
    out = copy(parts[1], tmp_path)
    f = out / "part-00001.h5"
    f.write_bytes(f.read_bytes()[:1000])
    fails(inspect(out), "part-00001.h5")


def test_swapped_parts(parts, tmp_path):
    out = copy(parts[1], tmp_path)
    a, b = out / "part-00000.h5", out / "part-00003.h5"
    os.rename(a, out / "tmp")
    os.rename(b, a)
    os.rename(out / "tmp", b)
    fails(inspect(out), "part-0000")


def test_swapped_parts_with_fixed_checksums(parts, tmp_path):
    """Even with meta.json's checksums updated to match, swapped part files are named."""
    out = copy(parts[1], tmp_path)
    a, b = out / "part-00000.h5", out / "part-00003.h5"
    os.rename(a, out / "tmp")
    os.rename(b, a)
    os.rename(out / "tmp", b)
    meta = json.loads((out / "meta.json").read_text())
    meta["files"]["part-00000.h5"], meta["files"]["part-00003.h5"] = (meta["files"]["part-00003.h5"],
                                                                      meta["files"]["part-00000.h5"])
    (out / "meta.json").write_text(json.dumps(meta))
    fails(inspect(out), "part-00000.h5", "swapped")


def test_missing_part(parts, tmp_path):
    out = copy(parts[1], tmp_path)
    (out / "part-00003.h5").unlink()
    fails(inspect(out), "part-00003.h5", "no such file")


def test_halo_send_inconsistency(parts, tmp_path):
    """A part file rewritten with a consistent checksum but a send list that disagrees with its neighbour."""
    from g3mpi.format import read_meta, read_part, write_part
    from g3mpi.format.partition import META_NAME
    out = copy(parts[1], tmp_path)
    meta = read_meta(out)
    p = next(i for i in range(4) if len(read_part(out, i, meta).send_rows) >= 2)
    part = read_part(out, p, meta)
    part.send_rows = part.send_rows.copy()
    s = int(part.send_offsets[0])
    part.send_rows[s], part.send_rows[s + 1] = part.send_rows[s + 1], part.send_rows[s]
    if part.send_offsets[1] - part.send_offsets[0] < 2:
        part.send_rows[s] = (part.send_rows[s] + 1) % part.num_owned
    name = f"part-{p:05d}.h5"
    meta["files"][name] = write_part(out / name, part, force=True)
    (out / META_NAME).write_text(json.dumps(meta))
    fails(inspect(out), "part-", "send list")


def test_meta_wrong_version(parts, tmp_path):
    out = copy(parts[1], tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    meta["version"] = 99
    (out / "meta.json").write_text(json.dumps(meta))
    fails(inspect(out), "meta.json", "version")


@pytest.mark.parametrize("change,what", [(dict(heads=8), "unexpected ['heads']"),
                                         (dict(bandwidth=-1.0), "bandwidth is -1.0"),
                                         (dict(width=2.5), "width is 2.5"), (dict(edge_seconds="x"), "edge_seconds"),
                                         (None, "expected a table")])
def test_meta_malformed_cost_model(parts, tmp_path, change, what):
    """A recorded cost model that g3-inspect cannot use is refused naming meta.json. Before, one with an extra
    key was silently replaced by the default (bandwidth 1e6 reported as 1.25e9, exit 0)."""
    out = copy(parts[1], tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    meta["cost_model"] = "oops" if change is None else {**meta.get("cost_model", {}), **change}
    (out / "meta.json").write_text(json.dumps(meta))
    fails(inspect(out), "meta.json", what)


def test_graph_corrupt(parts, tmp_path):
    g, d = parts
    bad = tmp_path / "bad.h5"
    data = bytearray((d / "g.h5").read_bytes())
    bad.write_bytes(bytes(data[: len(data) - 4096]))
    fails(inspect(bad), "bad.h5")


def rewrite_dataset(f, name, data):
    """Replace a dataset of an open graph.h5, with a matching checksum (so only the schema check can object)."""
    from g3mpi.format import array_sha256
    del f[name]
    f.create_dataset(name, data=data).attrs["sha256"] = array_sha256(data)


@pytest.mark.parametrize("change,what", [
    ("del num_nodes", "attribute 'num_nodes' is missing"), ("del num_edges", "attribute 'num_edges' is missing"),
    ("del feature_dim", "attribute 'feature_dim' is missing"),
    ("del num_classes", "attribute 'num_classes' is missing"),
    ("del symmetric", "attribute 'symmetric' is missing"), ("del source", "attribute 'source' is missing"),
    ("num_classes=seven", "attribute 'num_classes' must be an int"), ("num_nodes=-3", "must be >= 0"),
    ("self_loops=maybe", "'maybe'"), ("version=one", "version 'one'"),
    ("float32 indices", "'indices' must be integers"), ("int64 train_mask", "'train_mask' must be boolean"),
    ("group train_mask", "'train_mask' is a group, expected a dataset"),
    ("nan features", "features of node 7 are not finite as float32")])
def test_graph_schema(parts, tmp_path, change, what):
    """A graph.h5 whose attributes or dataset dtypes break docs/FORMAT.md is named by g3-inspect and g3-partition:
    missing or mistyped attributes were KeyError / ValueError tracebacks, float indices were accepted and an integer
    train_mask of 5s was reported as 'split masks overlap'."""
    import h5py
    import numpy as np
    g, d = parts
    bad = tmp_path / "bad.h5"
    shutil.copy(d / "g.h5", bad)
    with h5py.File(bad, "r+") as f:
        if change.startswith("del "):
            del f.attrs[change[4:]]
        elif "=" in change:
            key, value = change.split("=")
            f.attrs[key] = int(value) if value.lstrip("-").isdigit() else value
        elif change == "float32 indices":
            rewrite_dataset(f, "indices", f["indices"][()].astype(np.float32))
        elif change == "nan features":   # g3-inspect said OK (the checksum matches), g3-partition refused it
            x = f["features"][()]
            x[7, 0] = np.nan
            rewrite_dataset(f, "features", x)
        elif change == "group train_mask":
            del f["train_mask"]
            f.create_group("train_mask")
        else:
            rewrite_dataset(f, "train_mask", f["train_mask"][()].astype(np.int64) * 5)
    fails(inspect(bad), "bad.h5", what)
    p = run_module("data_tools.partition", bad, "--parts", 2, "--out", tmp_path / "out", "--no-progress", check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("g3-partition: error: "), p.stderr
    assert what in p.stderr and "Traceback" not in p.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name,what", [("nodir/x.png", "directory"), ("x.xyz", "unknown image format '.xyz'"),
                                       ("x", "no image format suffix"), ("adir.png", "is a directory")])
def test_plot_path_checked_first(parts, tmp_path, name, what):
    """A bad --plot is named before any work, with no report and no traceback (it ended in a traceback after the
    report); an existing directory is never replaced."""
    (tmp_path / "adir.png").mkdir()
    p = inspect(parts[1] / "parts", "--plot", tmp_path / name)
    fails(p, name, what)
    assert p.stdout == "" and (tmp_path / "adir.png").is_dir()


def test_plot_written_atomically(parts, tmp_path, monkeypatch):
    """The image appears only when complete: a failing savefig leaves neither the file nor a temporary one."""
    from matplotlib.figure import Figure
    from data_tools.inspection import inspect_path, plot_report
    from g3mpi.format import FormatError
    r = inspect_path(parts[1] / "parts")
    plot_report(r, tmp_path / "a.svg")
    assert (tmp_path / "a.svg").read_text().lstrip().startswith("<?xml")

    def broken(self, fname, **kw):
        Path(fname).write_bytes(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(FormatError, match="disk full"):
        plot_report(r, tmp_path / "b.png")
    assert sorted(os.listdir(tmp_path)) == ["a.svg"]


@pytest.mark.parametrize("change,what", [("rename", "dataset 'new_to_orig' is missing"),
                                         ("truncate", "not a readable HDF5 file"),
                                         ("float", "new_to_orig has dtype float64, expected an integer type")])
def test_node_map_damaged(parts, tmp_path, change, what):
    """A node_map.h5 without new_to_orig or truncated (meta.json's checksum updated to match) gave KeyError /
    OSError tracebacks; a float new_to_orig was accepted."""
    import h5py
    import numpy as np
    from g3mpi.format import file_sha256
    out = copy(parts[1], tmp_path)
    nm = out / "node_map.h5"
    if change == "truncate":
        nm.write_bytes(nm.read_bytes()[:len(nm.read_bytes()) // 2])
    else:
        with h5py.File(nm, "r+") as f:
            if change == "rename":
                f.move("new_to_orig", "other")
            else:
                a = f["new_to_orig"][()].astype(np.float64)
                del f["new_to_orig"]
                f["new_to_orig"] = a
    meta = json.loads((out / "meta.json").read_text())
    meta["files"]["node_map.h5"] = file_sha256(nm)
    (out / "meta.json").write_text(json.dumps(meta))
    fails(inspect(out), "node_map.h5", what)


def test_meta_files_not_a_dict(parts, tmp_path):
    """meta.json's files as a list of names gave an AttributeError traceback in read_node_map."""
    out = copy(parts[1], tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    meta["files"] = sorted(meta["files"])
    (out / "meta.json").write_text(json.dumps(meta))
    fails(inspect(out), "meta.json", "files must map")


def synthetic_report(P: int, seed: int = 0) -> dict:
    """A partition report as inspect_partition gives it, with only what the plot reads (no partition needed)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    halo, send = rng.integers(0, 400, P), rng.integers(0, 400, P)
    comp = rng.uniform(1e-5, 1e-3, P)
    parts = [dict(part=p, halo=int(halo[p]), send=int(send[p]), est_compute_seconds=float(comp[p]),
                  est_comm_seconds=float((halo[p] + send[p]) * 2e-6)) for p in range(P)]
    return dict(kind="partition", path=f"/x/parts{P}", method="random", num_parts=P, parts=parts)


@pytest.mark.parametrize("P", [1, 2, 4, 16, 64, 256, 1024])
def test_plot_legends_and_ticks_clear_of_the_data(P, tmp_path, monkeypatch):
    """At any number of parts: each legend lies outside every panel's data area, inside the figure, clear of the
    title and of the other legend; the parts' tick labels are whole part numbers, inside 0..P-1, each part's own
    up to 32 parts, and never overlap; the figure is at most 1600 px wide; the max line names the slowest part.
    Before, the legends sat inside the panels (over the bars: at 16 parts they hid parts 14-15) and 2 parts had
    ticks at -0.25, 0.25, ..."""
    import data_tools.inspection as insp
    from tests.plot_layout import check_legends, rendered, whole_ticks
    drawn = []

    def keep(*a, **kw):
        drawn.append(real(*a, **kw))
        return drawn[-1]
    real = insp.figure
    monkeypatch.setattr(insp, "figure", keep)
    r = synthetic_report(P)
    insp.plot_report(r, tmp_path / "p.png")
    fig, = drawn
    ren = rendered(fig, 100)   # the layout as savefig drew it
    assert fig.bbox.width <= 1600
    legends = check_legends(fig, ren, 2)
    values = whole_ticks(fig.axes[-1], ren)
    assert all(0 <= v <= P - 1 for v in values), values
    if P <= 32:
        assert values == list(range(P))
    else:
        assert len(values) >= 4
    worst = max(range(P), key=lambda p: r["parts"][p]["est_compute_seconds"] + r["parts"][p]["est_comm_seconds"])
    assert any(f"(part {worst})" in t.get_text() for t in legends[0].get_texts())
