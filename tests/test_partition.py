"""g3-partition: reassembly of every method and P into the exact input graph, invariants, determinism, options."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_module
from tests.partition_graphs import expected_edges, partition, random_graph, reassemble, write
from data_tools.inspection import inspect_path
from data_tools.partition import main as partition_main
from g3mpi.format import read_meta, read_node_map

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_cora_acceptance_figures", "test_g3_cli_options", "test_invariants_random_graphs",
              "test_no_empty_part_when_parts_near_nodes", "test_reassembly_exact", "test_volume_options_cli")


METHODS = [("metis", "nodes"), ("metis", "edges"), ("metis", "both"), ("metis", "train"), ("random", None),
           ("g3", None)]
PS = (1, 2, 3, 4, 7)


@pytest.mark.parametrize("which", ["cora", "rand"])
@pytest.mark.parametrize("method,balance", METHODS)
def test_reassembly_exact(which, method, balance, cora_h5, rand_h5, tmp_path):
    g, path = cora_h5 if which == "cora" else rand_h5
    want_src, want_dst = expected_edges(g)
    for P in PS:
        out = tmp_path / f"p{P}"
        partition(path, out, P, method, balance, 0, *(("--max-iters", "20") if method == "g3" else ()),
                  inproc=P != 4)
        src, dst, feats, labels, masks = reassemble(out)
        assert np.array_equal(src, want_src) and np.array_equal(dst, want_dst), f"edges differ for P={P}"
        assert np.array_equal(feats, g.features)
        assert np.array_equal(labels, g.labels)
        for k, m in masks.items():
            assert np.array_equal(m, getattr(g, k)), k
        meta = json.loads((out / "meta.json").read_text())
        assert meta["num_parts"] == P and meta["method"] == method and meta["num_nodes"] == g.num_nodes
        assert meta["num_edges"] == len(want_src) and meta["num_edges_input"] == g.num_edges
        assert "partition_seconds" in meta
        if method == "metis":
            assert meta["balance"] == balance


def test_cora_acceptance_figures(cora_h5, tmp_path):
    _, path = cora_h5
    partition(path, tmp_path / "parts", 4, "metis")
    r = json.loads(run_module("data_tools.inspection", tmp_path / "parts", "--json").stdout)
    assert (r["num_nodes"], r["num_edges"], r["num_parts"]) == (2708, 10556, 4)


@pytest.mark.parametrize("seed", range(4))
def test_invariants_random_graphs(seed, tmp_path):
    g = random_graph(n=150 + 37 * seed, m=700 + 100 * seed, seed=10 + seed)
    path = tmp_path / "g.h5"
    write(g, path)
    for method in ("metis", "random", "g3"):
        out = tmp_path / method
        partition(path, out, 3 + seed, method, None, seed, inproc=True)
        r = inspect_path(out)  # validates every part and every pair of parts
        assert sum(p["owned"] for p in r["parts"]) == g.num_nodes
        if method == "random":
            owned = [p["owned"] for p in r["parts"]]
            assert max(owned) - min(owned) <= 1
        if method == "g3":
            meta = read_meta(out)
            owned = np.array([p["owned"] for p in r["parts"]])
            assert owned.max() <= meta["node_imbalance_limit"] * owned.mean() + 1e-9
            assert meta["objective_after"] <= meta["objective_before"] + 1e-15


@pytest.mark.parametrize("method", ["metis", "random", "g3"])
def test_deterministic_with_seed(method, rand_h5, tmp_path):
    _, path = rand_h5
    maps = []
    for i in range(2):
        partition(path, tmp_path / f"a{i}", 4, method, None, 7, inproc=True)
        maps.append(read_node_map(tmp_path / f"a{i}"))
    assert np.array_equal(maps[0], maps[1])
    if method == "random":
        partition(path, tmp_path / "b", 4, method, None, 8, inproc=True)
        assert not np.array_equal(maps[0], read_node_map(tmp_path / "b"))


def test_g3_cli_options(rand_h5, tmp_path):
    _, path = rand_h5
    out = tmp_path / "g"
    partition(path, out, 4, "g3", None, 1, "--start", "kway", "--cost-slack", "0.01", "--max-iters", "20",
              "--start-balance", "edges", inproc=True)
    meta = read_meta(out)
    assert meta["cost_slack"] == 0.01 and meta["start"] == "metis balance=edges kway"
    assert meta["max_comm_rows_after"] <= meta["max_comm_rows_before"] or meta["violation_before"] > 0
    p = partition(path, tmp_path / "bad", 4, "g3", None, 0, "--cost-slack", "-1", check=False)
    assert p.returncode != 0 and "--cost-slack" in p.stderr


@pytest.mark.parametrize("method,option,value", [
    ("g3", "--balance", "edges"), ("random", "--balance", "nodes"), ("metis", "--max-iters", "5"),
    ("random", "--node-imbalance", "1.2"), ("metis", "--start", "volume"), ("random", "--cost-slack", "0.1"),
    ("metis", "--start-balance", "edges"), ("metis", "--edge-imbalance", "1.5"), ("g3", "--objective", "cut"),
    ("random", "--objective", "volume"), ("random", "--objective", "cut")])
def test_an_option_of_another_method_is_refused(method, option, value, rand_h5, tmp_path, capsys):
    """Options that only one method reads are refused with the others (exit 2, naming the option and the method)
    instead of being silently ignored (--balance with g3 or random, g3's refinement options with metis or
    random). The cost model's options apply to every method (meta.json's estimates)."""
    _, path = rand_h5
    args = [str(path), "--parts", "2", "--method", method, "--out", str(tmp_path / "out"), "--no-progress"]
    with pytest.raises(SystemExit) as e:
        partition_main(args + [option, value])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and line.startswith(f"g3-partition: error: {option} applies to --method "), line
    assert f"not {method}" in line and not (tmp_path / "out").exists()
    assert partition_main(args + ["--bandwidth", "25Gbit", "--width", "16"]) == 0


@pytest.mark.parametrize("option,value,method", [
    ("--seed", "-1", "random"), ("--seed", "99999999999999999999", "metis"), ("--seed", "-1", "g3"),
    ("--node-imbalance", "nan", "g3"), ("--node-imbalance", "inf", "g3"), ("--edge-imbalance", "nan", "g3"),
    ("--edge-imbalance", "0.5", "g3"), ("--edge-seconds", "-1", "g3"), ("--edge-seconds", "nan", "g3"),
    ("--edge-seconds", "0", "g3"), ("--width", "-5", "g3"), ("--width", "0", "g3"), ("--max-iters", "-1", "g3"),
    ("--cost-slack", "nan", "g3"), ("--cost-slack", "inf", "g3"), ("--bandwidth", "nan", "g3"),
    ("--bandwidth", "1e999", "g3"), ("--bandwidth", "0Gbit", "g3"), ("--bandwidth", "1.2.3Gbit", "g3"),
    ("--parts", "0", "metis"), ("--parts", "2000", "metis")])
def test_bad_option_values(option, value, method, rand_h5, tmp_path, capsys):
    """Every out-of-range value stops before any work with an argparse error naming the option (exit 2): some gave
    tracebacks (negative or huge seeds, NaN imbalances), others were recorded as negative or NaN objectives."""
    _, path = rand_h5
    args = [str(path), "--parts", "2", "--method", method, "--out", str(tmp_path / "out"), "--no-progress"]
    with pytest.raises(SystemExit) as e:
        partition_main(args + [option, value])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and lines[-1].startswith(f"g3-partition: error: {option}: "), lines
    assert not (tmp_path / "out").exists()


def test_volume_options_cli(rand_h5, tmp_path):
    """--method metis --objective volume and --method g3 --start volume end to end: valid parts, meta records."""
    _, path = rand_h5
    partition(path, tmp_path / "m", 4, "metis", "edges", 0, "--objective", "volume", inproc=True)
    meta = read_meta(tmp_path / "m")
    r = inspect_path(tmp_path / "m")
    assert meta["metis_objective"] == "volume" and meta["metis_volume"] >= r["total_halo"] > 0  # directed graph
    partition(path, tmp_path / "g", 4, "g3", None, 0, "--start", "volume", "--max-iters", "20", inproc=True)
    meta = read_meta(tmp_path / "g")
    inspect_path(tmp_path / "g")
    assert meta["start"].endswith("objective=volume")
    p = partition(path, tmp_path / "bad", 4, "metis", None, 0, "--objective", "nope", check=False)
    assert p.returncode != 0 and "--objective" in p.stderr
    p = partition(path, tmp_path / "bad", 4, "g3", None, 0, "--objective", "volume", check=False)
    assert p.returncode != 0 and "--start volume" in p.stderr and not (tmp_path / "bad").exists()


@pytest.mark.parametrize("method,extra", [("metis", ()), ("metis", ("--objective", "volume")), ("g3", ())])
def test_no_empty_part_when_parts_near_nodes(method, extra, rand_h5, tmp_path):
    """METIS leaves parts empty when P nears N (300 nodes into 250 parts): every part still gets a node, and the
    partition is valid."""
    g, path = rand_h5
    out = tmp_path / "p"
    partition(path, out, 250, method, None, 0, *extra, *(("--max-iters", "5") if method == "g3" else ()),
              inproc=True)
    r = inspect_path(out)
    owned = [p["owned"] for p in r["parts"]]
    assert len(owned) == 250 and min(owned) >= 1 and sum(owned) == g.num_nodes
    meta = read_meta(out)
    if method == "metis":
        assert meta.get("empty_parts_filled", 0) > 0  # the case is real: METIS did leave parts empty here
