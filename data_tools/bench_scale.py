"""Scale benchmark: one R-MAT graph through prepare -> partition -> train, measured stage by stage.

    python -m data_tools.bench_scale --work /scratch/scale --out scale.json            (R-MAT 23, EF 16)
    python -m data_tools.bench_scale --scale 14 --work W --out quick.json              (a quick run)

Stages, each a separate command run the way a user runs it:
  prepare          g3-prepare rmat (--scale, --edge-factor, --feature-dim, --classes, --memory-budget)
  partition-stream mpiexec -n RANKS g3-partition --method stream --parts PARTS
  partition-metis  g3-partition --method metis --parts PARTS, serial, only where its memory estimate fits
                   (METIS_BYTES_PER_EDGE, measured on R-MAT 20) in the memory available (``--metis auto``)
  partition-train  mpiexec -n RANKS g3-partition --method stream --parts TRAIN_RANKS (the training partition)
  train            mpiexec -n TRAIN_RANKS g3-train --model gcn --layers 2 --epochs EPOCHS --no-plots

Every process of a stage runs under :mod:`data_tools.peak_rss`, so each stage reports the peak RSS of each of its
ranks (and their sum) measured from outside the tool, its wall time and the bytes of its output on disk; the
partitions' quality (edge cut, max_comm_rows, imbalances, from meta.json, which the writer computes from the part
files) goes in a table, METIS's next to the stream partitioner's where both ran. The JSON record holds all of it,
with the command lines, the date, the CPU count and load average. Nothing is reused between runs unless asked:
each stage replaces its output in WORK (``--force`` semantics of each tool); ``--skip STAGE`` (repeatable) leaves
a stage out and uses its output in WORK from an earlier run instead (e.g. ``--skip prepare --skip
partition-stream``: a graph prepared once, only the training partition and the training measured again).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from g3mpi.format import write_json

from .peak_rss import read_records

#: peak RSS of serial METIS (g3-partition --method metis, whole process) per stored edge, measured on R-MAT 20
#: (16.6M edges, 4.2 GiB): the estimate behind --metis auto
METIS_BYTES_PER_EDGE = 270
GIB = 1 << 30
STAGES = ("prepare", "partition-stream", "partition-metis", "partition-train", "train")


def _mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    found = str(cand) if cand.exists() else shutil.which("mpiexec")
    if not found:
        raise SystemExit("bench_scale: error: no mpiexec beside this Python or on PATH (pip install mpich)")
    return found


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_stage(name: str, module: str, args: list, work: Path, output: Path, ranks: int = 1) -> dict:
    """Run one stage, ``python -m MODULE ARGS`` (under mpiexec and ``-m mpi4py`` when ``ranks`` > 1), each
    process wrapped by peak_rss; its record. A failed stage raises SystemExit after the tool's error output."""
    probe = work / f"rss-{name}"
    shutil.rmtree(probe, ignore_errors=True)
    cmd = [sys.executable, "-m", "data_tools.peak_rss", str(probe), sys.executable,
           *(["-m", "mpi4py"] if ranks > 1 else []), "-m", module, *map(str, args)]
    full = [_mpiexec(), "-n", str(ranks), *cmd] if ranks > 1 else cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    print(f"bench_scale: {name}: {' '.join(full)}", file=sys.stderr, flush=True)
    t0 = time.time()
    p = subprocess.run(full, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"bench_scale: error: stage {name} failed with status {p.returncode}")
    rss = [r["peak_rss_bytes"] for r in read_records(probe)]
    if len(rss) != ranks:
        raise SystemExit(f"bench_scale: error: stage {name}: {len(rss)} memory records for {ranks} ranks")
    rec = dict(stage=name, command=full, ranks=ranks, seconds=round(wall, 2), peak_rss_bytes=rss,
               peak_rss_bytes_max=max(rss), peak_rss_bytes_sum=sum(rss), bytes_written=_du(output))
    print(f"bench_scale: {name}: {wall:.1f} s, peak RSS per rank (MiB) "
          + " ".join(f"{b / 2**20:.0f}" for b in rss) + f", summed {sum(rss) / 2**20:.0f} MiB, "
          f"{rec['bytes_written'] / 2**20:.1f} MiB written", file=sys.stderr, flush=True)
    return rec


def _quality(parts: Path) -> dict:
    meta = json.loads((parts / "meta.json").read_text())
    q = meta["quality"]
    return dict(method=meta["method"], num_parts=meta["num_parts"], ranks=meta.get("ranks", 1),
                edge_cut=q["edge_cut"], max_comm_rows=q["max_comm_rows"], node_imbalance=q["node_imbalance"],
                compute_imbalance=q["compute_imbalance"], replication_factor=q["replication_factor"])


def _reused(path: Path, stage: str) -> Path:
    if not path.exists():
        raise SystemExit(f"bench_scale: error: --skip {stage}: {path} does not exist (run the stage once first)")
    return path


def build_parser():
    """The benchmark's options (the parser lives in :mod:`data_tools.cli`)."""
    from .cli import bench_scale_parser
    return bench_scale_parser()


def _prepare(a, work: Path, graph: Path, skip: set, stages: list) -> dict:
    """The prepare stage (or its reused output): g3-prepare's own record of the graph."""
    if "prepare" not in skip:
        stages.append(run_stage("prepare", "data_tools.prepare", [
            "rmat", "--scale", a.scale, "--edge-factor", a.edge_factor, "--feature-dim", a.feature_dim,
            "--classes", a.classes, "--memory-budget", a.memory_budget, "--out", graph, "--force", "--quiet"],
            work, graph))
    record = json.loads(_reused(Path(f"{graph}.prepare.json"), "prepare").read_text())
    if "prepare" not in skip:
        # g3-prepare resets its high-water mark at each of its stages (to measure them apart), so wait4 sees only
        # the last one's: its own record holds the whole run's peak
        prep = stages[-1]
        prep["tool_stages"] = record["stages"]
        prep["peak_rss_bytes"] = [max(prep["peak_rss_bytes"][0], int(record["total"]["peak_rss_bytes"]))]
        prep["peak_rss_bytes_max"] = prep["peak_rss_bytes_sum"] = prep["peak_rss_bytes"][0]
    elif int(record["num_nodes"]) != 1 << a.scale:
        raise SystemExit(f"bench_scale: error: --skip prepare: {graph} has {record['num_nodes']} nodes, not the "
                         f"2^{a.scale} of --scale {a.scale}")
    return record


def _print_tables(stages: list, quality: list, notes: list) -> None:
    """Per stage: ranks, wall, peak RSS (max and sum), bytes written; then the partitions' quality."""
    print(f"{'stage':<18}{'ranks':>6}{'seconds':>10}{'max RSS MiB':>13}{'sum RSS MiB':>13}{'written MiB':>13}")
    for s in stages:
        print(f"{s['stage']:<18}{s['ranks']:>6}{s['seconds']:>10.1f}{s['peak_rss_bytes_max'] / 2**20:>13.0f}"
              f"{s['peak_rss_bytes_sum'] / 2**20:>13.0f}{s['bytes_written'] / 2**20:>13.1f}")
    print(f"\n{'partition':<16}{'parts':>6}{'edge cut':>12}{'max comm':>11}{'node imb':>10}{'comp imb':>10}"
          f"{'repl':>8}")
    for q in quality:
        print(f"{q['method']:<16}{q.get('num_parts', ''):>6}{q['edge_cut']:>12}{q['max_comm_rows']:>11}"
              f"{q['node_imbalance']:>10.3f}{q['compute_imbalance']:>10.3f}{q['replication_factor']:>8.3f}")
    for n in notes:
        print(n)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    graph = work / "graph.h5"
    stages, quality, notes = [], [], []
    t0 = time.time()
    skip = set(a.skip)
    if skip:
        notes.append("stages left out, their outputs in WORK reused: " + ", ".join(s for s in STAGES if s in skip))
    record = _prepare(a, work, graph, skip, stages)
    num_edges = int(record["num_edges"])

    def partition(name: str, method: str, parts: int, ranks: int) -> Path:
        out = work / f"parts-{method}-{parts}"
        if name in skip:
            return _reused(out / "meta.json", name).parent
        stages.append(run_stage(name, "data_tools.partition", [graph, "--method", method, "--parts", parts,
                                                               "--out", out, "--force", "--no-progress"],
                                work, out, ranks=ranks))
        return out

    if "partition-stream" not in skip:
        quality.append(_quality(partition("partition-stream", "stream", a.parts, a.ranks)))
    estimate = METIS_BYTES_PER_EDGE * num_edges
    if "partition-metis" in skip:
        pass
    elif a.metis == "on" or (a.metis == "auto" and estimate < 0.8 * _available_bytes()):
        quality.append(_quality(partition("partition-metis", "metis", a.parts, 1)))
    else:
        notes.append(f"serial METIS not run: {a.metis}" if a.metis == "off" else
                     f"serial METIS not run: its estimate {estimate / GIB:.1f} GiB ({METIS_BYTES_PER_EDGE} B per "
                     f"edge) exceeds 80% of the {_available_bytes() / GIB:.1f} GiB available")
        print(f"bench_scale: {notes[-1]}", file=sys.stderr)
    train_parts = partition("partition-train", "stream", a.train_ranks, a.ranks)
    if "train" not in skip:
        run = work / "run"
        stages.append(run_stage("train", "g3mpi.cli.train", [
            "--parts", train_parts, "--out", run, "--force", "--model", "gcn", "--layers", 2, "--hidden",
            a.hidden, "--epochs", a.epochs, "--no-plots"], work, run, ranks=a.train_ranks))
        summary = json.loads((run / "summary.json").read_text())
        stages[-1]["epoch_time_median_s"] = summary.get("epoch_time_median_s")
    if len(quality) == 2:
        s, m = quality
        quality.append(dict(method="stream / metis", **{k: round(s[k] / m[k], 3) for k in (
            "edge_cut", "max_comm_rows", "node_imbalance", "compute_imbalance", "replication_factor")}))
    out = dict(benchmark="scale", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), argv=sys.argv,
               cpus=os.cpu_count(), load_average=os.getloadavg(), graph=dict(
                   scale=a.scale, edge_factor=a.edge_factor, num_nodes=int(record["num_nodes"]),
                   num_edges=num_edges, feature_dim=a.feature_dim, classes=a.classes),
               seconds=round(time.time() - t0, 1), stages=stages, quality=quality, notes=notes)
    write_json(a.out, out)
    _print_tables(stages, quality, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
