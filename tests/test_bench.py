"""g3-bench: a smoke run of every suite (tiny sizes): the JSON has its keys and finite numbers, the plots are PNG
files, and the deterministic figures hold (bytes equal the lower bound, every design computes the same logits).
No timing assertions: timings are measured by the benchmark, never asserted by a test."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import mpiexec, run_module, tool_env

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_bad_options", "test_bench_plot_legends_clear_of_the_data", "test_bytes",
              "test_error_on_rank0_ends_every_rank", "test_kernels", "test_memory", "test_memory_rgcn_node_embedding",
              "test_no_pickled_mpi_calls_in_the_tools", "test_partitions", "test_plots_draw_like_the_run_plots",
              "test_ranks_of_a_multi_rank_bench_share_results_as_json", "test_scaling", "test_schedules",
              "test_vs_pyg", "test_worker_closes_its_trainers", "test_user_model")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return root / "out", root / "work"


def bench(dirs, suite, *args):
    out, work = dirs
    run_module("g3mpi.bench.cli", suite, "--smoke", "--out", out, "--work", work, *args, timeout=900)
    doc = json.loads((out / f"{suite}.json").read_text())
    assert doc["suite"] == suite and doc["smoke"] is True
    assert {"command", "sizes", "machine", "elapsed_s", "result", "plots"} <= set(doc)
    assert doc["plots"], "no plot written"
    for name in doc["plots"]:
        assert (out / name).read_bytes()[:8] == PNG
    return doc["result"]


def finite(*xs):
    for x in xs:
        assert isinstance(x, (int, float)) and math.isfinite(x), x
        assert x >= 0, x


def test_vs_pyg(bench_dirs):
    res = bench(bench_dirs, "vs-pyg")
    assert set(res["models"]) == {"gcn", "sage", "gat"}
    for name, m in res["models"].items():
        finite(m["ratio_vs_pyg_csr"], m["ratio_vs_pyg_edge_index"], *m["median_epoch_s"].values())
        systems = {"g3mpi", "pyg-csr", "pyg-edge_index"} | ({"g3mpi-nocache"} if name != "gat" else set())
        assert set(m["median_epoch_s"]) == systems
        if name != "gat":
            finite(m["ratio_nocache_vs_pyg_csr"])
        # the systems train the same model: same first-epoch logits
        for s in systems - {"pyg-csr"}:
            assert m["first_epoch_logits_rel_diff"][s] < 1e-4, s


def test_kernels(bench_dirs):
    res = bench(bench_dirs, "kernels")
    for m in res["models"].values():
        finite(m["epoch_median_s"], m["kernel_sum_s"], m["ratio_epoch_vs_kernels"], *m["kernels_median_s"].values())
        assert any("spmm" in k for k in m["kernels_median_s"]) and any("gemm" in k for k in m["kernels_median_s"])


def test_bytes(bench_dirs):
    res = bench(bench_dirs, "bytes", "--models", "gcn")
    m = res["models"]["gcn"]
    finite(m["g3_bytes_per_epoch"], m["g3-original_bytes_per_epoch"], m["replicate-all_bytes_per_epoch"])
    # bytes are deterministic: g3mpi sends exactly the partition's lower bound, per rank too
    assert m["g3_bytes_per_epoch"] == res["lower_bound"]["total"] > 0
    assert m["designs"]["g3"]["rank_bytes_sent"] == res["lower_bound"]["per_rank"]
    assert m["saving_vs_g3-original"] > 0 and m["saving_vs_replicate-all"] > 0
    for d, diff in m["check_rel_diff"].items():
        assert diff < 1e-4, (d, diff)


def test_schedules(bench_dirs):
    """Two networks in one run, ranks bound to cores: per configuration the ratios, per-rank blocked and epoch
    times, and a recorded timeline of every schedule (drawn as timeline-*.png)."""
    from tests.timeline_record import check_record
    res = bench(bench_dirs, "schedules", "--models", "gcn", "--bind-to", "core", "--sim-net", "1Gbit,50us",
                "--sim-net", "200Mbit,100us")
    assert [(c["ranks"], c["sim_net"], c["bind_to"]) for c in res["configs"]] == [
        (2, "1Gbit,50us", "core"), (2, "200Mbit,100us", "core")]
    for conf in res["configs"]:
        m = conf["models"]["gcn"]
        assert set(m["epoch_time_median_s"]) == {"pipelined", "blocking", "nocomm"}
        finite(m["pipelined_vs_blocking"], m["pipelined_vs_nocomm"], m["pipelined_vs_ideal"], m["ideal_s"],
               m["rank0_blocked_pipelined_vs_blocking"], *m["epoch_time_median_s"].values())
        for d in m["schedules"].values():
            finite(*d["rank_compute_s"], *d["rank_blocked_s"], *d["rank_idle_s"], *d["rank_epoch_s"])
        assert m["schedules"]["nocomm"]["bytes_sent_per_epoch"] == 0 < \
            m["schedules"]["pipelined"]["bytes_sent_per_epoch"]
        assert set(m["timelines"]) == {"pipelined", "blocking", "nocomm"}
        for s in ("pipelined", "blocking"):
            check_record(m["timelines"][s], 2, 3, "gcn")
    out = bench_dirs[0]
    assert (out / "timeline-gcn-2r-1Gbit-50us.png").read_bytes()[:8] == PNG


def test_scaling(bench_dirs):
    res = bench(bench_dirs, "scaling")
    finite(res["ranks_vs_threads"], *(v["epoch_time_median_s"] for v in res["real"].values()))
    assert set(res["real"]) == {"1x2", "2x1"}
    assert res["oversubscribed"]["informational"] is True
    finite(*(v["epoch_time_median_s"] for v in res["oversubscribed"]["runs"].values()))


def test_memory(bench_dirs):
    res = bench(bench_dirs, "memory", "--models", "gcn")
    m = res["models"]["gcn"]
    for r in m["ranks"] + m["remat"]["ranks"] + m["release_memory"]["ranks"]:
        finite(r["ratio"], r["rss_peak"], r["rss_base"], r["bytes_per_owned_row"], *r["theoretical"].values())
        assert r["rss_peak"] >= r["rss_base"] > 0
        assert r["theoretical"]["total"] == sum(v for k, v in r["theoretical"].items() if k != "total")
        # every byte of the theoretical size attributed to what sizes it, against the model's split
        b = r["breakdown"]
        assert sum(b["measured"].values()) == b["attributed"] == r["theoretical"]["total"]
        assert b["unattributed"] == r["rss_data"] - b["attributed"] and b["not_modelled"] == []
        assert set(b["per_unit"]) == {"owned_row", "halo_row", "send_row", "edge"}
        for v in b["per_unit"].values():
            finite(v["measured"], v["modelled"], v["ratio"])
    # what autograd keeps with remat is a fraction of the default's
    assert max(r["theoretical"]["activations"] for r in m["remat"]["ranks"]) < \
        min(r["theoretical"]["activations"] for r in m["ranks"])
    finite(m["remat_vs_none"])


def test_memory_rgcn_node_embedding(bench_dirs):
    """R-GCN on a typed graph over a learned node embedding table: the model's terms (the typed block, the R x out
    messages, the table's rows with their gradients and Adam moments) against what the rank holds."""
    res = bench(bench_dirs, "memory", "--models", "rgcn", "--graph", "rmat", "--relations", "4",
                "--node-embedding", "8")
    assert (res["relations"], res["node_embedding"]) == (4, 8) and res["graph"].endswith("-r4-s0.h5")
    m = res["models"]["rgcn"]
    for r in m["ranks"] + m["remat"]["ranks"]:
        b = r["breakdown"]
        assert b["not_modelled"] == [] and sum(b["measured"].values()) == b["attributed"] == r["theoretical"]["total"]
        table = b["terms"]["params"]["owned_row"]     # the table's rows: 16 D bytes held, 28 D modelled (the step)
        assert table["measured"] == 16 * 8 and table["modelled"] == 28 * 8
        rows = b["terms"]["activations"]["owned_row"]
        finite(rows["measured"], rows["modelled"], rows["ratio"])
        assert b["terms"]["exchange"]["halo_row"]["ratio"] == pytest.approx(1.0, rel=0.05)


def test_user_model(bench_dirs):
    """The user GCN of docs/examples starts from the built-in GCN's parameters and computes its logits."""
    res = bench(bench_dirs, "user-model")
    assert set(res["designs"]) == {"builtin", "user"} and res["ranks"] == 2
    for d in res["designs"].values():
        finite(d["epoch_time_median_s"], *d["rank_compute_s"], *d["rank_blocked_s"])
        assert d["bytes_sent_per_epoch"] > 0
    assert res["designs"]["user"]["bytes_sent_per_epoch"] == res["designs"]["builtin"]["bytes_sent_per_epoch"]
    finite(res["user_vs_builtin"])
    assert res["initial_logits_rel_diff"] <= 1e-5


def test_partitions(bench_dirs):
    res = bench(bench_dirs, "partitions")
    assert set(res["partitions"]) == {"metis-nodes", "metis-edges", "metis-both", "g3", "g3-cut", "auto"}
    for d in res["partitions"].values():
        finite(d["epoch_time_median_s"], *d["rank_compute_s"], *d["rank_blocked_s"], *d["rank_idle_s"],
               d["quality"]["max_comm_rows"], d["quality"]["replication_factor"])
        assert len(d["rank_compute_s"]) == res["ranks"]
    assert set(res["g3_vs"]) == {"metis-nodes", "metis-edges", "metis-both"}
    assert set(res["g3_cut_vs"]) == {"metis-nodes", "metis-edges", "metis-both", "g3", "auto"}
    assert set(res["auto_vs"]) == {"metis-nodes", "metis-edges", "metis-both", "g3", "g3-cut"}
    finite(*res["g3_vs"].values(), *res["g3_cut_vs"].values(), *res["auto_vs"].values())
    starts = {k: json.loads((Path(res["partitions"][k]["parts"]) / "meta.json").read_text())["start"]
              for k in ("g3", "g3-cut")}
    assert starts["g3"].endswith("objective=volume") and starts["g3-cut"].endswith("recursive")  # R-MAT: skewed


def test_bad_options(tmp_path):
    p = run_module("g3mpi.bench.cli", "vs-pyg", "--dims", "16,x", "--out", tmp_path / "o", check=False)
    assert p.returncode != 0 and "g3-bench: error" in p.stderr and "--dims" in p.stderr
    p = run_module("g3mpi.bench.cli", "nosuch", "--out", tmp_path / "o", check=False)
    assert p.returncode != 0 and "invalid choice" in p.stderr


@pytest.mark.parametrize("opt", [("--epochs", "0"), ("--nodes", "0"), ("--nodes", "1"), ("--edges", "0"),
                                 ("--threads", "0"), ("--heads", "0"), ("--repeats", "0"), ("--gat-epochs", "0"),
                                 ("--max-ranks", "0"), ("--ranks", "0"), ("--epochs", "x"), ("--dims", "16"),
                                 ("--models", "gcn,foo"), ("--sim-net", "10Gbit")])
def test_bad_values_refused_by_the_parser(opt, capsys):
    # 0 used to mean "the default" (--epochs 0, --nodes 0, --threads 0 ran with the defaults); --heads 0 and
    # --repeats 0 ended in tracebacks
    from g3mpi.bench.cli import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(["vs-pyg", *opt, "--out", "o"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith(f"g3-bench: error: argument {opt[0]}: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("args, msg", [(("vs-pyg", "--heads", "3"), "--heads 3 must divide the hidden width 256"),
                                       (("scaling", "--threads", "1"), "T must be at least 2"),
                                       (("all", "--threads", "1"), "T must be at least 2"),
                                       (("kernels", "--models", "gcn,gat"), "GCN and SAGE only"),
                                       (("bytes", "--models", "gcn,user"), "model user is the memory suite's"),
                                       (("partitions", "--ranks", "2,4"), "for the schedules suite only"),
                                       (("memory", "--models", "rgcn"), "R-GCN needs a typed graph"),
                                       (("memory", "--relations", "4"), "a typed graph is generated by rmat"),
                                       (("bytes", "--node-embedding", "8"), "are the memory suite's"),
                                       (("partitions", "--sim-net", "1Gbit,1us", "--sim-net", "2Gbit,1us"),
                                        "it takes one network")])
def test_options_checked_together(args, msg, capsys):
    # --heads 3 used to train GAT with 255 hidden channels; scaling --threads 1 ran 2 x 2 (T = max(2, threads))
    from g3mpi.bench.cli import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args([*args, "--out", "o"])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_zero_is_a_value_not_the_default(tmp_path):
    from g3mpi.bench.cli import build_parser, parse_args
    sz = parse_args(["scaling", "--threads", "3", "--nodes", "2", "--smoke", "--out", "o"]).sizes_for("scaling")
    assert (sz.threads, sz.nodes) == (3, 2)
    assert "partitions (4)" in build_parser().format_help()   # --ranks names every suite it applies to
    p = run_module("g3mpi.bench.cli", "vs-pyg", "--smoke", "--epochs", "0", "--out", tmp_path / "o", check=False,
                   timeout=120)
    assert p.returncode == 2 and "argument --epochs: 0: must be at least 1" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "o").exists()


def test_config_from_the_command_line(capsys):
    # one frozen BenchConfig, built and checked right after parsing; None: the suite's default
    import dataclasses

    from g3mpi.bench.cli import BenchConfig, parse_args
    from g3mpi.bench.common import SYSTEMS, Sizes
    cfg = parse_args(["schedules", "--dims", "8,12,3", "--heads", "4", "--models", "gat", "--ranks", "3",
                      "--no-plots", "--out", "o"])
    assert cfg == BenchConfig(suite="schedules", out=Path("o"), dims=(8, 12, 3), heads=4, models=("gat",),
                              ranks=(3,), plots=False)
    assert (cfg.sim_net, cfg.repeats, cfg.max_ranks, cfg.systems, cfg.smoke) == (("10Gbit,20us",), 2, 8, SYSTEMS,
                                                                                   False)
    assert cfg.sizes_for("schedules") == Sizes(nodes=65_536, edges=2_097_152, dims=(8, 12, 3), epochs=5, heads=4,
                                               graph="rmat")
    assert (cfg.models_for("schedules"), cfg.ranks_for("schedules"), cfg.suites()) == (("gat",), 3, ("schedules",))
    cfg = parse_args(["all", "--smoke", "--systems", "pyg-csr,g3mpi", "--out", "o"])
    assert cfg.systems == ("g3mpi", "pyg-csr") and cfg.plots and cfg.suites()[0] == "vs-pyg"
    assert (cfg.models_for("kernels"), cfg.ranks_for("bytes"), cfg.sizes_for("scaling").threads) == \
        (("gcn", "sage"), 2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.heads = 2
    # the checks together are the dataclass's: the same message from BenchConfig and from the command line
    msg = "vs-pyg: --heads 3 must divide the hidden width 256 of GAT (hidden width = heads x channels)"
    with pytest.raises(ValueError) as e:
        BenchConfig(suite="vs-pyg", out=Path("o"), heads=3)
    assert str(e.value) == msg
    with pytest.raises(SystemExit) as e:
        parse_args(["vs-pyg", "--heads", "3", "--out", "o"])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"g3-bench: error: {msg} (g3-bench --help lists the options)\n"


def test_worker_config_from_its_command_line():
    # what the suites put on the worker's command line (common.run_worker) comes back as a frozen WorkerConfig
    import dataclasses

    from g3mpi.bench import worker
    cfg = worker.parse_args(["--parts", "p", "--designs", "g3,replicate-all", "--schedules", "pipelined,nocomm",
                             "--no-input-cache", "--epochs", "2", "--json", "w.json"])
    assert cfg == worker.WorkerConfig(parts="p", json="w.json", designs=("g3", "replicate-all"),
                                      schedules=("pipelined", "nocomm"), epochs=2, input_cache=False)
    assert (cfg.model, cfg.hidden, cfg.layers, cfg.heads, cfg.sim_net, cfg.threads) == ("gcn", 256, 2, 8, "", 1)
    assert worker.parse_args(["--parts", "p", "--json", "w.json"]).designs == ("g3",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3
    with pytest.raises(ValueError, match=r"^unknown design 'g4' \(g3, g3-original, replicate-all, user\)$"):
        worker.parse_args(["--parts", "p", "--designs", "g3,g4", "--json", "w.json"])


@pytest.fixture
def live_contexts(monkeypatch):
    """The CommContexts made and not freed since the fixture started."""
    from g3mpi.comm import halo
    live = set()
    init, free = halo.CommContext.__init__, halo.CommContext.free

    def tracked_init(self, *a, **kw):
        init(self, *a, **kw)
        live.add(id(self))

    def tracked_free(self):
        free(self)
        live.discard(id(self))
    monkeypatch.setattr(halo.CommContext, "__init__", tracked_init)
    monkeypatch.setattr(halo.CommContext, "free", tracked_free)
    return live


def test_one_rank_suites_free_their_exchanges(live_contexts):
    # every g3mpi net of vs-pyg and kernels had its own CommContext (a duplicated communicator and persistent
    # requests) that was never freed
    from g3mpi.bench import kernels, pyg
    from g3mpi.bench.common import Sizes
    sz = Sizes(nodes=200, edges=1500, dims=(8, 16, 3), epochs=1, heads=2)
    pyg.run(sz, models=("gcn", "gat"))
    kernels.run(sz, models=("sage",))
    assert not live_contexts


def test_worker_closes_its_trainers(tmp_path, live_contexts):
    from mpi4py import MPI

    from g3mpi.bench import worker
    from g3mpi.bench.common import Sizes, prepare_graph, prepare_parts
    graph = prepare_graph(Sizes(nodes=300, edges=2400, dims=(8, 16, 3), epochs=1), tmp_path)
    parts = prepare_parts(graph, 1, tmp_path)
    cfg = worker.parse_args(["--parts", str(parts), "--hidden", "16", "--epochs", "1",
                             "--designs", "g3,g3-original,replicate-all", "--json", str(tmp_path / "w.json")])
    res = worker.run(cfg, MPI.COMM_SELF)   # not worker.main: an error there would abort the test process
    # replicate-all on one part (no halo) once failed with an IndexError on the empty halo list
    assert set(res["variants"]) == {"g3", "g3-original", "replicate-all"}
    assert not live_contexts


def test_plots_draw_like_the_run_plots(tmp_path):
    # with g3mpi.plotting.figure (object API, constrained layout), as the run plots and g3-inspect do: no pyplot
    # state and no matplotlib.use("Agg") switching the backend of the process that draws them
    code = f"""
import sys
from pathlib import Path
from g3mpi.bench.plots import plot_vs_pyg
res = dict(models=dict(gcn=dict(median_epoch_s={{"g3mpi": 1.0, "pyg-csr": 2.0}})))
print(plot_vs_pyg(res, Path({str(tmp_path)!r})), "matplotlib.pyplot" in sys.modules)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-1] == "False"
    assert (tmp_path / "vs-pyg.png").read_bytes()[:8] == PNG


def _bench_results(P: int) -> dict:
    """Suite results as the plots read them, for P ranks (the tallest bars at the panels' left and right ends,
    where a legend inside the panel would sit)."""
    rng = np.random.default_rng(P)

    def ranks(scale):
        return list(scale * (1 + rng.random(P)))

    def breakdown():
        return dict(rank_compute_s=ranks(1.0), rank_blocked_s=ranks(0.3), rank_idle_s=ranks(0.1))
    models = ("gcn", "sage", "gat")
    return {
        "vs-pyg": dict(models={m: dict(median_epoch_s={"g3mpi": 1.0 + i, "pyg-csr": 2.0, "pyg-coo": 2.5 - i,
                                                       "pyg-sparse": 1.5}) for i, m in enumerate(models)}),
        "kernels": dict(models={m: dict(epoch_median_s=1.0 + i, spmm_sum_s=0.5, gemm_sum_s=0.3, other_sum_s=0.1)
                                for i, m in enumerate(models)}),
        "bytes": dict(lower_bound=dict(per_rank=ranks(1e6)),
                      models={m: dict(designs={d: dict(rank_bytes_sent=ranks(2e6))
                                               for d in ("g3", "g3-original", "replicate-all")}) for m in models}),
        "schedules": dict(configs=[dict(ranks=P, sim_net="10Gbit,20us",
                          models={m: dict(epoch_time_median_s=dict(pipelined=1.0, blocking=1.2, nocomm=0.9),
                                          schedules={s: breakdown() for s in ("pipelined", "blocking", "nocomm")})
                                  for m in models[:2]})]),
        "scaling": dict(model="gcn", real={"1x2": dict(epoch_time_median_s=1.0), "2x1": dict(epoch_time_median_s=0.8)},
                        oversubscribed=dict(runs={str(p): dict(epoch_time_median_s=1.0 / p, **breakdown())
                                                  for p in (1, 2, 4, 8)})),
        "memory": dict(models={m: dict(ranks=[dict(rank=r, rss_data=float(3 << 30), owned=1000 + r,
                                                   theoretical={c: float(1 << 29) for c in ("part", "matrices",
                                                                "exchange", "activations", "params")},
                                                   breakdown=_breakdown(m == "user", r))
                                              for r in range(P)]) for m in models + ("user",)}),
        "partitions": dict(model="gcn", ranks=P, sim_net="10Gbit,20us",
                           partitions={k: dict(epoch_time_median_s=1.0, **breakdown())
                                       for k in ("metis", "random", "g3")}),
    }


def _breakdown(user: bool, rank: int) -> dict:
    """A memory suite rank's breakdown as ``memory.compare`` gives it (what the plot reads)."""
    pu = {u: dict(measured=v * (1 + rank), modelled=v, ratio=1.0 + rank)
          for u, v in (("owned_row", 900.0), ("halo_row", 120.0), ("send_row", 40.0), ("edge", 20.0))}
    if user:
        return dict(not_modelled=["activations"], per_unit={u: dict(v, modelled=None, ratio=None)
                                                            for u, v in pu.items()}, per_unit_modelled_terms=pu)
    return dict(not_modelled=[], per_unit=pu)


@pytest.mark.parametrize("P", [1, 2, 8])
def test_bench_plot_legends_clear_of_the_data(P, tmp_path, monkeypatch):
    """Every benchmark plot's legend lies above its panel, outside every panel's data area, inside the figure and
    clear of the titles, tick labels and other legends (tests/plot_layout.py, as the run plots and g3-inspect's
    are checked). Before, the grouped bars (vs-pyg, bytes), kernels and memory drew theirs inside the panel,
    over the bars."""
    from tests.plot_layout import check_legends, rendered
    from g3mpi.bench import plots
    drawn = {}

    def save(fig, path):
        drawn[Path(path).name] = fig
        return str(path)
    monkeypatch.setattr(plots, "_save", save)
    for suite, res in _bench_results(P).items():
        plots.PLOTS[suite](res, tmp_path)
    want = {"vs-pyg.png": 1, "kernels.png": 1, "scaling.png": 0, "scaling-breakdown.png": 1, "partitions.png": 3,
            **{f"bytes-{m}.png": 1 for m in ("gcn", "sage", "gat")},
            **{f"memory-{m}.png": 2 for m in ("gcn", "sage", "gat", "user")},
            **{f"schedules-{m}-{P}r-10Gbit-20us.png": 3 for m in ("gcn", "sage")}}
    assert sorted(drawn) == sorted(want)
    for name, fig in drawn.items():
        legends = check_legends(fig, rendered(fig, 110), want[name])
        assert all(leg.get_title().get_text() for leg in legends), name    # each names its panel
    assert sorted(t.get_text() for t in drawn["memory-gat.png"].axes[0].get_legend().get_texts()) == [
        "peak RSS - baseline", "theoretical: activations", "theoretical: exchange", "theoretical: matrices",
        "theoretical: params", "theoretical: part"]
    # the breakdown beside it: measured and modelled bytes per unit, the ratio under each unit; for a user's
    # model, over the terms the memory model has
    for m in ("gat", "user"):
        ax = drawn[f"memory-{m}.png"].axes[1]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["measured", "modelled"]
        assert [t.get_text() for t in ax.get_xticklabels()][0] == f"owned row\n{P:.2f}x"
        assert ("activations not modelled" in ax.get_legend().get_title().get_text()) is (m == "user")


def test_write_json_is_atomic_and_leaves_nothing_behind(tmp_path):
    # it used to leave its temporary file beside the target when the write failed (and never fsync'ed it)
    from g3mpi.bench.common import BenchError, write_json
    path = tmp_path / "r.json"
    write_json(path, {"a": 1})
    with pytest.raises(TypeError):   # not JSON: the write fails half-way (NaN is written as null since f9b25a9)
        write_json(path, {"a": 2, "b": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and json.loads(path.read_text()) == {"a": 1}
    (tmp_path / "d.json").mkdir()
    with pytest.raises(BenchError, match="is a directory"):
        write_json(tmp_path / "d.json", {})
    assert (tmp_path / "d.json").is_dir()


def test_lower_bound_counts_backward_only_where_a_gradient_flows():
    from g3mpi.bench.wire import lower_bound
    meta = dict(num_parts=2, parts=[dict(halo=10, send=7), dict(halo=7, send=10)])
    lb = lower_bound(meta, (128, 256, 40))
    # layer 0 aggregates its raw input (128 <= 256): forward only; layer 1 at min(256, 40) = 40 both ways
    assert lb["layers"][0] == dict(layer=0, width=128, forward=17 * 128 * 4, backward=0)
    assert lb["layers"][1] == dict(layer=1, width=40, forward=17 * 40 * 4, backward=17 * 40 * 4)
    assert lb["per_rank"] == [7 * 128 * 4 + (7 + 10) * 40 * 4, 10 * 128 * 4 + (10 + 7) * 40 * 4]
    assert sum(lb["per_rank"]) == lb["total"]


def bench_mpi(n, *args, timeout):
    """``mpiexec -n n python -m g3mpi.bench.cli ARGS`` (plain, as jobs/mpirun/bench.sh starts it: no mpi4py abort
    on an uncaught error); (exit status, stderr, seconds). Ranks still running after ``timeout`` are killed and
    the test fails: a rank waited for one that had given up."""
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "g3mpi.bench.cli", *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env(),
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        pytest.fail(f"{' '.join(cmd)} still running after {timeout}s (a rank waits forever):\n{err[-2000:]}")
    return p.returncode, err, time.monotonic() - t0


def test_bad_option_ends_every_rank(tmp_path):
    # refused by the parser on every rank before any communication (it used to fail on rank 0 alone, inside the
    # suite, while rank 1 waited for its result forever)
    rc, err, _ = bench_mpi(2, "vs-pyg", "--smoke", "--systems", "g3mpi", "--out", tmp_path / "o", timeout=30)
    assert rc == 2, err
    assert "g3-bench: error" in err and "--systems" in err and "must include g3mpi and pyg-csr" in err
    assert not (tmp_path / "o").exists()


def test_error_on_rank0_ends_every_rank(tmp_path):
    # vs-pyg runs on rank 0, which fails writing its plot; rank 1 must not go on to the next suite and wait there
    out = tmp_path / "o"
    (out / "vs-pyg.png").mkdir(parents=True)
    rc, err, _ = bench_mpi(2, "all", "--smoke", "--models", "gcn", "--out", out, "--work", tmp_path / "w",
                           timeout=120)
    assert rc == 1, err
    assert "g3-bench: error: [rank 0]" in err and "vs-pyg.png" in err
    assert "[rank 1] stopping: rank 0 failed" in err


def test_one_rank_error_aborts_the_job(capfd):
    # an error raised on one rank alone ends the whole job (MPI_Abort) after its line is out
    from g3mpi.bench.cli import fail

    class Comm:
        rank, size, aborted = 1, 2, None

        def Abort(self, code):
            self.aborted = code

    comm = Comm()
    assert fail(comm, ValueError("bad thing")) == 1
    assert comm.aborted == 1
    assert "g3-bench: error: [rank 1] bad thing" in capfd.readouterr().err


def test_ranks_of_a_multi_rank_bench_share_results_as_json(tmp_path):
    # g3-bench started on 2 ranks: the graph path from rank 0 and the per-rank epoch figures of the in-process
    # worker go between the ranks as JSON text (never pickled), and the suite's JSON has both ranks' figures
    rc, err, _ = bench_mpi(2, "bytes", "--smoke", "--models", "gcn", "--no-plots", "--out", tmp_path / "o",
                           "--work", tmp_path / "w", timeout=180)
    assert rc == 0, err
    doc = json.loads((tmp_path / "o" / "bytes.json").read_text())
    g3 = doc["result"]["models"]["gcn"]["designs"]["g3"]
    assert g3["rank_bytes_sent"] == doc["result"]["lower_bound"]["per_rank"]
    assert g3["rank_bytes_recv"] == g3["rank_bytes_sent"][::-1] and min(g3["rank_bytes_sent"]) > 0


def test_to_json_keeps_what_the_results_hold():
    from g3mpi.bench.common import to_json
    obj = dict(a=np.float32(1.5), b=np.arange(3), c=float("nan"), d=(1, 2), p=Path("/x/y"), i=np.int64(7))
    back = json.loads(to_json(obj))
    assert back["a"] == 1.5 and back["b"] == [0, 1, 2] and np.isnan(back["c"]) and back["d"] == [1, 2]
    assert back["p"] == "/x/y" and back["i"] == 7
    with pytest.raises(TypeError, match="object cannot go to another rank"):
        to_json(object())


def test_no_pickled_mpi_calls_in_the_tools():
    """g3mpi and data_tools talk between ranks with buffer calls (``Allreduce``, ``Isend``) or text; mpi4py's
    lowercase calls pickle what they send and unpickle what they receive."""
    import ast
    lower = {"send", "recv", "isend", "irecv", "bcast", "gather", "allgather", "scatter", "alltoall", "reduce",
             "allreduce", "sendrecv", "ibcast", "igather", "iallgather", "iscatter", "ialltoall", "ireduce",
             "iallreduce", "scan", "exscan", "mprobe", "improbe"}
    root = Path(__file__).resolve().parents[1]
    found = []
    for f in sorted([*root.glob("g3mpi/**/*.py"), *root.glob("data_tools/**/*.py")]):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in lower:
                owner = ast.unparse(node.func.value)
                if owner.split(".")[-1].lower().endswith("comm") or owner.endswith("COMM_WORLD"):
                    found.append(f"{f.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
