"""Half-precision benchmark: a synthetic graph in OGB's binary layout (float16 features, as ogbn-papers100M) through
g3-prepare ogb, g3-partition and g3-train, float16 kept against the float32 import of the same values.

    python -m data_tools.bench_feature_dtype --work /scratch/f16 --out f16.json      (10M nodes, 20M edges, F 128)
    python -m data_tools.bench_feature_dtype --nodes 20000 --edges 80000 --work W --out quick.json

Stages, each a separate command:
  generate   raw/data.npz (members stored: edge_index [2, E] int64, node_feat [N, F] float16 N(0, 1),
             num_nodes_list, num_edges_list), raw/node-label.npz (node_label float32 [N, 1], a tenth NaN) and
             split/time/{train,valid,test}.csv.gz, written block by block (never an [N, F] or [2, E] array)
  prepare    g3-prepare ogb DIR --memory-budget B, once keeping float16 (the default) and once with
             --feature-dtype float32; peak RSS polled from outside (VmRSS of /proc/PID/status, every 20 ms: the
             tool resets its own high-water mark per stage, so wait4's ru_maxrss sees only its last stage) and
             the tool's own record (``total.peak_rss_bytes``); the graph files' sizes
  partition  g3-partition --method random --parts 2 --seed 0 of each graph (the same assignment): part sizes
  train      mpiexec -n 2 g3-train --epochs 2 --hidden H on each partition (``--train-nodes``: on a graph
             generated with that many nodes instead, when the big one would not fit in memory), H = F by default so
             that the first layer aggregates the features themselves (a narrower H multiplies by the weight
             first and sends float32 products, whatever the stored dtype); the first layer's halo bytes: the
             input halo fetched once (summary.json's ``input_halo_bytes``), and, for comparison, those a float32
             run with --no-input-cache sends in every epoch; the largest difference of the runs' logits

The JSON record holds every figure with the commands, the load average and the ratios the acceptance asks for:
peak RSS / (budget), float16 / float32 file sizes, halo bytes and the logits' difference.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

from g3mpi.format import write_json

from .bench_scale import _du, run_stage

BLOCK = 1 << 22


def _member(zf: zipfile.ZipFile, name: str, dtype, shape, blocks) -> None:
    """One .npy member written from ``blocks`` (arrays in C order whose concatenation fills ``shape``)."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, dict(descr=np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                     fortran_order=False, shape=tuple(shape)))
        for b in blocks:
            f.write(np.ascontiguousarray(b, dtype=dtype).tobytes())


def generate(root: Path, n: int, e: int, f: int, seed: int = 0) -> None:
    """The synthetic dataset of the module docstring under ``root`` (stored members)."""
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    ss = np.random.SeedSequence(seed)
    s_src, s_dst, s_x, s_y = (np.random.default_rng(s) for s in ss.spawn(4))
    with zipfile.ZipFile(raw / "data.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        def ends(rng):
            for a in range(0, e, BLOCK):
                yield rng.integers(0, n, min(BLOCK, e - a), dtype=np.int64)
        _member(zf, "edge_index", np.int64, (2, e), (b for g in (ends(s_src), ends(s_dst)) for b in g))
        rows = max(1, BLOCK // max(1, f))
        _member(zf, "node_feat", np.float16, (n, f),
                (s_x.standard_normal((min(rows, n - a), f), dtype=np.float32) for a in range(0, n, rows)))
        _member(zf, "num_nodes_list", np.int64, (1,), [np.array([n])])
        _member(zf, "num_edges_list", np.int64, (1,), [np.array([e])])
    y = s_y.integers(0, 16, n).astype(np.float32)
    y[s_y.random(n) < 0.1] = np.nan
    with zipfile.ZipFile(raw / "node-label.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        _member(zf, "node_label", np.float32, (n, 1), [y])
    labelled = s_y.permutation(np.flatnonzero(~np.isnan(y)))
    k = len(labelled)
    for name, idx in (("train", labelled[:k // 2]), ("valid", labelled[k // 2:3 * k // 4]),
                      ("test", labelled[3 * k // 4:])):
        d = root / "split" / "time"
        d.mkdir(parents=True, exist_ok=True)
        with gzip.open(d / f"{name}.csv.gz", "wt", compresslevel=1) as g:
            for a in range(0, len(idx), BLOCK):
                g.write("\n".join(map(str, np.sort(idx)[a:a + BLOCK].tolist())) + "\n")


def polled_peak(cmd: list, env: dict) -> tuple[int, int, float, str]:
    """Run ``cmd``; (exit status, the largest VmRSS seen polling every 20 ms, seconds, stderr's tail)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def poll():
        status = Path(f"/proc/{p.pid}/status")
        while p.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except OSError:
                break
            time.sleep(0.02)
    t = threading.Thread(target=poll, daemon=True)
    t.start()
    _, err = p.communicate()
    t.join()
    return p.returncode, peak[0], time.time() - t0, err[-3000:]


def prepare(root: Path, out: Path, budget: str, dtype: str | None) -> dict:
    cmd = [sys.executable, "-m", "data_tools.prepare", "ogb", str(root), "--out", str(out), "--force", "--quiet",
           "--memory-budget", budget, *(["--feature-dtype", dtype] if dtype else [])]
    print(f"bench_feature_dtype: {' '.join(cmd)}", file=sys.stderr, flush=True)
    rc, peak, secs, err = polled_peak(cmd, dict(os.environ, OMP_NUM_THREADS="1"))
    if rc != 0:
        sys.stderr.write(err)
        raise SystemExit(f"bench_feature_dtype: error: g3-prepare failed with status {rc}")
    rec = json.loads(Path(str(out) + ".prepare.json").read_text())
    return dict(command=cmd, seconds=round(secs, 2), peak_rss_polled_bytes=peak,
                peak_rss_record_bytes=rec["total"]["peak_rss_bytes"], graph_bytes=out.stat().st_size,
                build=rec["build"])


def halo_bytes(run: Path) -> list:
    """The per-epoch byte counters of metrics.jsonl's last line (as the trainer writes them)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = [x for x in lines if "epoch" in x][-1]
    return {k: v for k, v in last.items() if "bytes" in k}


def logits_diff(a: Path, b: Path) -> float:
    import h5py
    with h5py.File(a / "predictions.h5") as fa, h5py.File(b / "predictions.h5") as fb:
        la, lb = fa["logits"][:], fb["logits"][:]
    # relative to the largest logit: an element's own relative error is meaningless where it is near zero
    return float(np.max(np.abs(la - lb)) / max(float(np.max(np.abs(lb))), 1e-30)) if la.size else 0.0


def main(argv=None) -> int:
    from .cli import bench_feature_dtype_parser
    ap = bench_feature_dtype_parser()
    a = ap.parse_args(argv)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    rec = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpus=os.cpu_count(),
               loadavg=os.getloadavg(), nodes=a.nodes, edges=a.edges, feature_dim=a.feature_dim,
               memory_budget=a.memory_budget)
    root = work / "synth"
    if not a.skip_generate:
        t0 = time.time()
        generate(root, a.nodes, a.edges, a.feature_dim)
        rec["generate_seconds"] = round(time.time() - t0, 1)
    rec["input_bytes"] = _du(root)
    from .cli import parse_size
    budget = parse_size(a.memory_budget)
    for tag, dtype in (("f16", None), ("f32", "float32")):
        rec[f"prepare_{tag}"] = prepare(root, work / f"{tag}.h5", a.memory_budget, dtype)
        p = rec[f"prepare_{tag}"]
        p["peak_over_budget"] = round(max(p["peak_rss_polled_bytes"], p["peak_rss_record_bytes"]) / budget, 3)
        rec[f"partition_{tag}"] = run_stage(f"partition-{tag}", "data_tools.partition",
                                            [work / f"{tag}.h5", "--parts", 2, "--method", "random", "--seed", 0,
                                             "--out", work / f"{tag}-parts", "--force", "--no-progress"],
                                            work, work / f"{tag}-parts")
    rec["graph_ratio"] = round(rec["prepare_f16"]["graph_bytes"] / rec["prepare_f32"]["graph_bytes"], 4)
    rec["parts_ratio"] = round(rec["partition_f16"]["bytes_written"] / rec["partition_f32"]["bytes_written"], 4)
    train_root = work
    if a.train_nodes:
        small = work / "small"
        generate(small / "synth", a.train_nodes, 2 * a.train_nodes, a.feature_dim, seed=1)
        for tag, dtype in (("f16", None), ("f32", "float32")):
            prepare(small / "synth", small / f"{tag}.h5", a.memory_budget, dtype)
            run_stage(f"partition-small-{tag}", "data_tools.partition",
                      [small / f"{tag}.h5", "--parts", 2, "--method", "random", "--seed", 0, "--out",
                       small / f"{tag}-parts", "--force", "--no-progress"], small, small / f"{tag}-parts")
        train_root = small
        rec["train_nodes"] = a.train_nodes
    hidden = a.hidden or a.feature_dim
    rec["hidden"] = hidden
    for tag, parts, extra in (("f16", "f16", ()), ("f32", "f32", ()), ("f32_nocache", "f32", ("--no-input-cache",))):
        run = train_root / f"run-{tag}"
        rec[f"train_{tag}"] = run_stage(f"train-{tag}", "g3mpi.cli.train",
                                        ["--parts", train_root / f"{parts}-parts", "--out", run, "--force",
                                         "--epochs", 2, "--hidden", hidden, "--no-progress", "--no-plots",
                                         "--eval-every", 1, *extra], train_root, run, ranks=2)
        rec[f"train_{tag}"]["bytes"] = halo_bytes(run)
        rec[f"train_{tag}"]["input_halo_bytes"] = json.loads((run / "summary.json").read_text())["input_halo_bytes"]
    f16, f32, old = (rec[f"train_{t}"] for t in ("f16", "f32", "f32_nocache"))
    rec["input_halo_ratio"] = round(f16["input_halo_bytes"] / max(1, f32["input_halo_bytes"]), 4)
    # per epoch, the first layer's float32 rows that --no-input-cache sends and the kept halo does not
    rec["layer0_bytes_per_epoch_nocache"] = old["bytes"]["bytes_sent"] - f32["bytes"]["bytes_sent"]
    rec["logits_max_rel_diff"] = logits_diff(train_root / "run-f16", train_root / "run-f32")
    rec["logits_max_rel_diff_nocache"] = logits_diff(train_root / "run-f32_nocache", train_root / "run-f32")
    write_json(a.out, rec)
    print(json.dumps({k: rec[k] for k in ("graph_ratio", "parts_ratio", "input_halo_ratio",
                                          "layer0_bytes_per_epoch_nocache", "logits_max_rel_diff",
                                          "logits_max_rel_diff_nocache")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
