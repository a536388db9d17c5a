"""Bad input to ``g3-train --task link`` (issue 50): a part file edited after partitioning so that a split names a
node out of range, or a held-out pair is an edge of the message-passing graph (leakage), a graph without splits,
a metric that does not fit the task, the pair exchange on a device it does not run on: one clear line for the
ranks that found it (the job's one line naming them), a non-zero exit, no run written."""
from __future__ import annotations

import numpy as np
import pytest

import data_tools
from data_tools.build import write_partition
from g3mpi.format import load_graph, read_meta, read_part
from g3mpi.format.links import link_name
from tests.graphs import random_graph
from tests.part_edits import edit_part, replace_ds
from tests.train_runs import error_lines, train

SLOW_TESTS = ("test_bad_part_links_one_line_on_every_rank", "test_clean_partition_trains")
ARGS = ["--task", "link", "--epochs", "1", "--metric", "roc_auc", "--no-plots"]


@pytest.fixture(scope="module")
def lp_parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("lp_bad")
    g = random_graph(n=80, seed=3)
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    data_tools.write_graph(d / "g.h5", np.stack([g.indices, rows]), g.features, y=g.labels,
                           link_split=(0.8, 0.1, 0.1), split_seed=0)
    asg = np.arange(g.num_nodes) % 2
    write_partition(load_graph(d / "g.h5"), asg, 2, d / "p2", method="random", seed=0)
    return d / "p2"


@pytest.fixture
def parts(lp_parts, tmp_path):
    import shutil
    out = tmp_path / "p2"
    shutil.copytree(lp_parts, out)
    return out


def leak(parts):
    """Part 1's first val pair replaced by an edge of the graph whose source part 1 owns."""
    meta = read_meta(parts)
    p1 = read_part(parts, 1, meta)
    # an in-edge of some part-0 row from a part-1 source: looked up in part 0's CSR
    p0 = read_part(parts, 0, meta)
    g0 = np.r_[np.arange(p0.owned_start, p0.owned_end), p0.halo_ids]
    rows = np.repeat(np.arange(p0.num_owned), np.diff(p0.indptr)) + p0.owned_start
    src = g0[p0.indices]
    k = int(np.flatnonzero((src >= p1.owned_start) & (src < p1.owned_end))[0])
    e = p1.links[link_name("val", "edge")].copy()
    e[0] = (src[k], rows[k])
    edit_part(parts, 1, lambda f: replace_ds(f, link_name("val", "edge"), e))
    return int(p1.orig_ids[src[k] - p1.owned_start])


@pytest.mark.parametrize("case", ["target out of range", "source not owned", "held-out pair in the graph"])
def test_bad_part_links_one_line_on_every_rank(case, parts, tmp_path):
    meta = read_meta(parts)
    if case == "held-out pair in the graph":
        src_orig = leak(parts)
        want = (f"link_val_edge: pair 0 (node {src_orig} -> node ", "is also an edge of the message-passing "
                "graph (in part-00000.h5's CSR)", "leakage")
        where, ranks = "part-00001.h5", [0, 1]     # (every rank learns the same pair)
    else:
        p1 = read_part(parts, 1, meta)
        e = p1.links[link_name("test", "edge")].copy()
        if case == "target out of range":
            e[0, 1] = meta["num_nodes"] + 7
            want = ("link_test_edge: a pair's target is out of range",)
        else:
            e[0, 0] = p1.owned_start - 1
            want = ("link_test_edge: a pair's source is not owned by this part",)
        edit_part(parts, 1, lambda f: replace_ds(f, link_name("test", "edge"), e))
        where, ranks = "part-00001.h5", [1]    # (the rank that read it; the job's line names it)
    p = train(2, parts, tmp_path / "r", *ARGS, check=False)
    lines = error_lines(p.stderr)
    assert p.returncode != 0 and sorted(lines) == ranks, p.stderr
    for v in lines.values():
        assert len(v) == 1 and where in v[0] and all(w in v[0] for w in want), p.stderr
    assert not (tmp_path / "r").exists()
    print(f"{case}: exit {p.returncode} after {p.elapsed:.1f} s:", lines)


def test_clean_partition_trains(lp_parts, tmp_path):
    """The check finds nothing in a partition as g3-partition wrote it (its lookup is not vacuous: above)."""
    train(2, lp_parts, tmp_path / "r", *ARGS)
    assert (tmp_path / "r" / "summary.json").exists()
