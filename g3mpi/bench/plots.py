"""PNG plots of the suites' JSON, drawn like the run plots with :func:`g3mpi.plotting.figure` (matplotlib's object
API, constrained layout: no display, no pyplot state), every legend above its panel, clear of the bars
(:func:`g3mpi.plotting.legend_above`, titled with the panel's title). One function per suite; each returns the
list of files it wrote."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.plotting import figure, legend_above, rank_breakdown, timeline

from .overlap import SCHEDULES


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=110)
    return str(path)


def _bars(ax, groups, series, values, ylabel, title):
    """Grouped bars: values[s][g] for every series s and group g; the legend, titled ``title``, above the panel
    (up to four entries a row)."""
    x = np.arange(len(groups))
    w = 0.8 / max(1, len(series))
    handles = [ax.bar(x + (i - (len(series) - 1) / 2) * w, [values[s][g] or 0 for g in groups], w, label=s)
               for i, s in enumerate(series)]
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    legend_above(ax, handles, ncol=min(4, len(series)), title=title)


def plot_vs_pyg(res: dict, out: Path) -> list:
    models = list(res["models"])
    systems = list(dict.fromkeys(s for m in models for s in res["models"][m]["median_epoch_s"]))
    vals = {s: {m: res["models"][m]["median_epoch_s"].get(s) for m in models} for s in systems}
    fig = figure(6, 4)
    ax = fig.subplots()
    _bars(ax, models, systems, vals, "median epoch time (s)", "one rank: g3mpi vs PyG (epoch time per system)")
    return [_save(fig, out / "vs-pyg.png")]


def plot_kernels(res: dict, out: Path) -> list:
    models = list(res["models"])
    fig = figure(6, 4)
    ax = fig.subplots()
    x = np.arange(len(models))
    m = [res["models"][k] for k in models]
    handles = [ax.bar(x - 0.2, [v["epoch_median_s"] for v in m], 0.4, label="epoch")]
    sp, ge, ot = ([v[k] for v in m] for k in ("spmm_sum_s", "gemm_sum_s", "other_sum_s"))
    handles.append(ax.bar(x + 0.2, sp, 0.4, label="kernels: spmm"))
    handles.append(ax.bar(x + 0.2, ge, 0.4, bottom=sp, label="kernels: gemm"))
    handles.append(ax.bar(x + 0.2, ot, 0.4, bottom=np.add(sp, ge), label="kernels: other"))
    ax.set_xticks(x, models)
    ax.set_ylabel("seconds")
    legend_above(ax, handles, ncol=4, title="epoch vs sum of isolated kernels (one rank)")
    return [_save(fig, out / "kernels.png")]


def plot_bytes(res: dict, out: Path) -> list:
    files = []
    for model, m in res["models"].items():
        d = m["designs"]
        P = len(d["g3"]["rank_bytes_sent"])
        ranks = [str(r) for r in range(P)]
        series = {"lower bound": res["lower_bound"]["per_rank"]}
        series.update({k: v["rank_bytes_sent"] for k, v in d.items()})
        vals = {s: {r: v[int(r)] / 1e6 for r in ranks} for s, v in series.items()}
        fig = figure(7, 4)
        ax = fig.subplots()
        _bars(ax, ranks, list(series), vals, "MB sent per epoch", f"{model}: bytes sent per rank and epoch")
        ax.set_xlabel("rank")
        files.append(_save(fig, out / f"bytes-{model}.png"))
    return files


def _config_tag(conf: dict) -> str:
    """'2r-1Gbit-50us': a schedules configuration in a file name."""
    return f"{conf['ranks']}r-" + conf["sim_net"].replace(",", "-").replace("/", "")


def plot_schedules(res: dict, out: Path) -> list:
    """Per configuration and model: the median epoch times and each schedule's per-rank breakdown
    (``schedules-MODEL-TAG.png``), and the recorded epoch of each schedule as a per-rank timeline on one time
    scale (``timeline-MODEL-TAG.png``)."""
    files = []
    for conf in res["configs"]:
        tag = _config_tag(conf)
        for model, m in conf["models"].items():
            sch = list(m["schedules"])
            fig = figure(4 * (len(sch) + 1), 3.6)
            axes = fig.subplots(1, len(sch) + 1)
            axes[0].bar(sch, [m["epoch_time_median_s"][s] for s in sch], color=["C0", "C1", "C2"][:len(sch)])
            axes[0].set_ylabel("median epoch time (s)")
            axes[0].set_title(f"{model}, {conf['ranks']} ranks, sim-net {conf['sim_net']}", fontsize=9)
            for ax, s in zip(axes[1:], sch):
                d = m["schedules"][s]
                rank_breakdown(ax, d["rank_compute_s"], d["rank_blocked_s"], d["rank_idle_s"],
                               f"{s}: per-rank breakdown")
            files.append(_save(fig, out / f"schedules-{model}-{tag}.png"))
            tls = {s: m["timelines"][s] for s in SCHEDULES if m.get("timelines", {}).get(s)}
            if tls:
                end = max(e[3] for d in tls.values() for r in d["ranks"] for e in r["events"])
                lanes = [sum(1.4 + len({e[1] for e in r["events"] if e[0] == "post"}) for r in d["ranks"])
                         for d in tls.values()]
                fig = figure(12, 1.5 * len(tls) + 0.22 * sum(lanes))
                axes = fig.subplots(len(tls), 1, squeeze=False, height_ratios=[3 + x for x in lanes])[:, 0]
                for ax, (s, d) in zip(axes, tls.items()):
                    timeline(ax, d, f"{model}, {s}, {conf['ranks']} ranks, sim-net {conf['sim_net']}: "
                                    f"one recorded epoch", xmax=end)
                files.append(_save(fig, out / f"timeline-{model}-{tag}.png"))
    return files


def plot_scaling(res: dict, out: Path) -> list:
    fig = figure(10, 4)
    axes = fig.subplots(1, 2)
    real = res["real"]
    axes[0].bar(list(real), [v["epoch_time_median_s"] for v in real.values()], color=["C0", "C1"])
    axes[0].set_ylabel("median epoch time (s)")
    axes[0].set_xlabel("ranks x threads")
    axes[0].set_title(f"{res['model']}: ranks vs threads (real)")
    ov = res["oversubscribed"]["runs"]
    Ps = sorted(int(p) for p in ov)
    axes[1].plot(Ps, [ov[str(p)]["epoch_time_median_s"] for p in Ps], "o-")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("ranks (1 thread each)")
    axes[1].set_ylabel("median epoch time (s)")
    axes[1].set_title("1 -> 8 ranks oversubscribed (informational)")
    files = [_save(fig, out / "scaling.png")]
    if Ps:
        d = ov[str(Ps[-1])]
        fig = figure(6, 4)
        ax = fig.subplots()
        rank_breakdown(ax, d["rank_compute_s"], d["rank_blocked_s"], d["rank_idle_s"],
                       f"{Ps[-1]} ranks (oversubscribed): per-rank breakdown")
        files.append(_save(fig, out / "scaling-breakdown.png"))
    return files


def plot_memory(res: dict, out: Path) -> list:
    """Per model: each rank's theoretical size by term against its peak RSS above the baseline, and (where the
    ranks have a breakdown) the bytes per owned row, halo row, send row and edge of the rank with the most owned
    rows, measured against modelled (over the modelled terms only where one is not modelled)."""
    files = []
    for model, m in res["models"].items():
        rk = m["ranks"]
        cats = ("part", "matrices", "exchange", "activations", "params")
        has = all(r.get("breakdown") for r in rk)
        fig = figure(12 if has else 6, 4)
        axes = fig.subplots(1, 2 if has else 1, squeeze=False)[0]
        ax = axes[0]
        x = np.arange(len(rk))
        bottom = np.zeros(len(rk))
        handles = []
        for c in cats:
            v = np.array([r["theoretical"][c] for r in rk]) / 2**20
            handles.append(ax.bar(x - 0.2, v, 0.4, bottom=bottom, label=f"theoretical: {c}"))
            bottom += v
        handles.append(ax.bar(x + 0.2, [r["rss_data"] / 2**20 for r in rk], 0.4, label="peak RSS - baseline",
                              color="k"))
        ax.set_xticks(x, [str(r["rank"]) for r in rk])
        ax.set_xlabel("rank")
        ax.set_ylabel("MiB")
        legend_above(ax, handles, ncol=3, title=f"{model}: peak RSS vs theoretical data size")
        if has:
            _per_unit_panel(axes[1], model, max(rk, key=lambda r: r["owned"]))
        files.append(_save(fig, out / f"memory-{model}.png"))
    return files


def _per_unit_panel(ax, model: str, r: dict) -> None:
    """Bytes per unit of one rank's breakdown, measured and modelled side by side, the ratio under each unit."""
    b = r["breakdown"]
    pu = b["per_unit_modelled_terms"] if b["not_modelled"] else b["per_unit"]
    units = list(pu)
    names = dict(owned_row="owned row", halo_row="halo row", send_row="send row", edge="edge")
    groups = [names.get(u, u) + ("" if pu[u]["ratio"] is None else f"\n{pu[u]['ratio']:.2f}x") for u in units]
    scope = f" ({', '.join(b['not_modelled'])} not modelled: the other terms)" if b["not_modelled"] else ""
    vals = {s: {g: pu[u][s] for g, u in zip(groups, units)} for s in ("measured", "modelled")}
    _bars(ax, groups, ["measured", "modelled"], vals, "bytes per unit",
          f"{model}, rank {r['rank']}: bytes per unit, measured / modelled{scope}")
    if all(v for s in vals.values() for v in s.values()):    # (bytes per row and per edge differ tenfold)
        ax.set_yscale("log")


def plot_partitions(res: dict, out: Path) -> list:
    labels = list(res["partitions"])
    fig = figure(4 + 3.2 * len(labels), 4)
    axes = fig.subplots(1, 1 + len(labels))
    axes[0].bar(labels, [res["partitions"][k]["epoch_time_median_s"] for k in labels],
                color=[f"C{i}" for i in range(len(labels))])
    axes[0].set_ylabel("median epoch time (s)")
    axes[0].set_title(f"{res['model']}, {res['ranks']} ranks, sim-net {res['sim_net']}", fontsize=9)
    axes[0].tick_params(axis="x", labelrotation=30)
    for ax, k in zip(axes[1:], labels):
        d = res["partitions"][k]
        rank_breakdown(ax, d["rank_compute_s"], d["rank_blocked_s"], d["rank_idle_s"], f"{k}: per-rank breakdown")
    return [_save(fig, out / "partitions.png")]


def plot_user_model(res: dict, out: Path) -> list:
    labels = ["builtin", "user"]
    fig = figure(10.4, 4)
    axes = fig.subplots(1, 3)
    axes[0].bar(labels, [res["epoch_time_median_s"][k] for k in labels], color=["C0", "C1"])
    axes[0].set_ylabel("median epoch time (s)")
    axes[0].set_title(f"gcn, {res['ranks']} ranks, sim-net {res['sim_net']}: user/built-in "
                      f"{res['user_vs_builtin']:.3f}", fontsize=9)
    for ax, k in zip(axes[1:], labels):
        d = res["designs"][k]
        rank_breakdown(ax, d["rank_compute_s"], d["rank_blocked_s"], d["rank_idle_s"], f"{k}: per-rank breakdown")
    return [_save(fig, out / "user-model.png")]


PLOTS = {"vs-pyg": plot_vs_pyg, "kernels": plot_kernels, "bytes": plot_bytes, "schedules": plot_schedules,
         "scaling": plot_scaling, "memory": plot_memory, "partitions": plot_partitions,
         "user-model": plot_user_model}
