"""g3-partition's methods side by side on one graph: wall time, peak RSS and quality, as a user runs them.

    python -m data_tools.bench_methods GRAPH.h5 --parts 8,16 --work W --out methods.json
    python -m data_tools.bench_methods GRAPH.h5 --parts 8 --methods auto,kaminpar,metis,stream --ranks 4 ...

Each (P, method) is one ``g3-partition`` command (``stream`` and ``auto`` under ``mpiexec -n RANKS``), every process
wrapped by :mod:`data_tools.peak_rss` (:func:`data_tools.bench_scale.run_stage`): wall time, peak RSS summed over
the ranks, and the partition's quality from its meta.json (``max_comm_rows``, node and edge imbalance). The
methods of one P run one after the other, so they share the machine's load as closely as a shared machine
allows; the load average is recorded before and after each. A method that fails (METIS out of memory) is
recorded as failed and the others go on. Ratios of the default (``auto``) against node-balanced METIS and the
stream partitioner, and the checks of issue 37's targets, close the record (docs/PARTITION_METHODS.md).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from g3mpi.format import write_json

from .bench_scale import run_stage

#: name -> g3-partition's options (``stream`` runs on --ranks ranks, the others on one)
METHODS = {
    "auto": ["--method", "auto"],
    "kaminpar": ["--method", "kaminpar"],
    "kaminpar-strong": ["--method", "kaminpar", "--kaminpar-context", "strong"],
    "metis": ["--method", "metis"],
    "metis-g3": ["--method", "metis", "--refine", "g3"],
    "g3": ["--method", "g3"],
    "stream": ["--method", "stream"],
}
#: run under ``mpiexec -n RANKS``: the stream method, and the default as a user launches it with the stream
#: method (a serial choice then runs on rank 0 while the others wait); the other serial methods on one process
PARALLEL = ("auto", "stream")
#: issue 37's targets for the default against node-balanced METIS (and the stream method)
TARGETS = dict(comm_vs_metis=1.0, imbalance=1.10, wall_vs_metis=0.25, wall_vs_stream=0.5, rss_vs_metis=0.5)


def measure(graph: Path, P: int, name: str, ranks: int, work: Path) -> dict:
    out = work / f"parts-{name}-{P}"
    load0 = os.getloadavg()
    try:
        rec = run_stage(f"{name}-{P}", "data_tools.partition",
                        [graph, "--parts", P, *METHODS[name], "--out", out, "--force", "--no-progress"], work, out,
                        ranks=ranks if name in PARALLEL else 1)
    except SystemExit as e:   # the tool's error is on stderr already
        return dict(method=name, parts=P, failed=str(e), load_average=[load0, os.getloadavg()])
    meta = json.loads((out / "meta.json").read_text())
    q = meta["quality"]
    return dict(method=name, parts=P, ranks=rec["ranks"], seconds=rec["seconds"],
                partition_seconds=meta.get("partition_seconds"), peak_rss_bytes_sum=rec["peak_rss_bytes_sum"],
                peak_rss_bytes=rec["peak_rss_bytes"], meta_method=meta["method"],
                max_comm_rows=q["max_comm_rows"], edge_cut=q["edge_cut"], node_imbalance=q["node_imbalance"],
                edge_imbalance=q["compute_imbalance"], replication_factor=q["replication_factor"],
                load_average=[load0, os.getloadavg()], command=rec["command"])


def compare(rows: list) -> list:
    """Per P: the default's ratios to METIS and to stream, and whether each target holds."""
    out = []
    for P in sorted({r["parts"] for r in rows}):
        by = {r["method"]: r for r in rows if r["parts"] == P and "failed" not in r}
        if "auto" not in by:
            continue
        a, c = by["auto"], dict(parts=P)
        for ref in ("metis", "stream"):
            if ref in by:
                for k in ("max_comm_rows", "seconds", "peak_rss_bytes_sum"):
                    c[f"{k}_vs_{ref}"] = round(a[k] / max(1e-12, by[ref][k]), 3)
        checks = dict(imbalance=max(a["node_imbalance"], a["edge_imbalance"]) <= TARGETS["imbalance"])
        comm_ref = "metis" if "metis" in by else "stream"
        if f"max_comm_rows_vs_{comm_ref}" in c:
            checks[f"comm_vs_{comm_ref}"] = c[f"max_comm_rows_vs_{comm_ref}"] <= TARGETS["comm_vs_metis"]
        if "seconds_vs_metis" in c:
            checks["wall_vs_metis"] = c["seconds_vs_metis"] <= TARGETS["wall_vs_metis"]
            checks["rss_vs_metis"] = c["peak_rss_bytes_sum_vs_metis"] <= TARGETS["rss_vs_metis"]
        if "seconds_vs_stream" in c:
            checks["wall_vs_stream"] = c["seconds_vs_stream"] <= TARGETS["wall_vs_stream"]
        out.append(dict(c, checks=checks))
    return out


def print_table(rows: list, comparisons: list, out=sys.stdout) -> None:
    print(f"{'P':>3} {'method':<16} {'ranks':>5} {'wall_s':>8} {'RSS_MiB':>8} {'max_comm':>9} {'node_imb':>8} "
          f"{'edge_imb':>8} {'load':>5}", file=out)
    for r in rows:
        if "failed" in r:
            print(f"{r['parts']:>3} {r['method']:<16} failed: {r['failed']}", file=out)
            continue
        print(f"{r['parts']:>3} {r['method']:<16} {r['ranks']:>5} {r['seconds']:>8.1f} "
              f"{r['peak_rss_bytes_sum'] / 2**20:>8.0f} {r['max_comm_rows']:>9} {r['node_imbalance']:>8.3f} "
              f"{r['edge_imbalance']:>8.3f} {r['load_average'][0][0]:>5.1f}", file=out)
    for c in comparisons:
        print(f"P={c['parts']}: " + ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("parts", "checks"))
              + "; checks " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in c["checks"].items()), file=out)


def main(argv=None) -> int:
    from .cli import bench_methods_parser
    ap = bench_methods_parser()
    a = ap.parse_args(argv)
    methods = [m for m in a.methods.split(",") if m]
    if not methods or not set(methods) <= set(METHODS):
        ap.error(f"--methods: choose from {','.join(METHODS)}")
    try:
        parts = [int(p) for p in a.parts.split(",")]
    except ValueError:
        ap.error(f"--parts: comma-separated integers, got {a.parts!r}")
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0, rows = time.time(), []
    for P in parts:
        for name in methods:
            rows.append(measure(a.graph.resolve(), P, name, a.ranks, work))
            comparisons = compare(rows)
            write_json(a.out, dict(benchmark="partition-methods", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                   argv=sys.argv, graph=str(a.graph), cpus=os.cpu_count(),
                                   affinity=len(os.sched_getaffinity(0)), seconds=round(time.time() - t0, 1),
                                   targets=TARGETS, rows=rows, comparisons=comparisons))
    print_table(rows, compare(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
