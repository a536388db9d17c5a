"""The three schedules side by side in one MPI invocation: pipelined vs blocking vs nocomm.

    mpiexec -n 4 python -m mpi4py -m g3mpi.bench.schedules [--parts DIR | --scale 16 --features 64]
        [--model gcn] [--layers 3] [--hidden 128] [--sim-net 10Gbit,20us] [--epochs 7]

Without ``--parts``, rank 0 generates an RMAT graph (a=0.57, b=c=0.19, edge factor 16, symmetrised, no self
loops or duplicates; random features and labels) and partitions it with METIS into one part per rank, in a
temporary directory. Each schedule gets its own trainer (same seed, same model); the schedules alternate epoch
by epoch so machine noise hits them alike. An epoch's time is the slowest rank's; the first epoch is excluded.
Prints per schedule the median epoch time, compute and blocked time and overlap, and the ratios
pipelined/blocking and pipelined/nocomm (nocomm skips the exchange: a lower bound, its results are wrong).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
from mpi4py import MPI

SCHEDULES = ("pipelined", "blocking", "nocomm")


def rmat_graph(scale: int, edge_factor: int, features: int, classes: int, seed: int = 0,
               abc=(0.57, 0.19, 0.19)):
    from g3mpi.format import Graph
    rng = np.random.default_rng(seed)
    n, e = 1 << scale, edge_factor << scale
    a, b, c = abc
    src = np.zeros(e, np.int64)
    dst = np.zeros(e, np.int64)
    for _ in range(scale):
        r = rng.random(e)
        s_bit = r >= a + b                     # quadrants c, d
        d_bit = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d
        src = (src << 1) | s_bit
        dst = (dst << 1) | d_bit
    perm = rng.permutation(n)                  # hide RMAT's degree ordering
    src, dst = perm[src], perm[dst]
    key = np.unique(np.concatenate([dst * n + src, src * n + dst]))
    dst, src = key // n, key % n
    keep = src != dst
    src, dst = src[keep], dst[keep]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    x = rng.standard_normal((n, features), dtype=np.float32)
    y = rng.integers(0, classes, n)
    m = rng.random(n)
    return Graph(indptr, src.astype(np.int32), x, y, m < 0.6, (m >= 0.6) & (m < 0.8), m >= 0.8,
                 dict(num_classes=classes, source=f"rmat:scale={scale},ef={edge_factor},seed={seed}"))


def metis_assignment(g, parts: int, seed: int = 0) -> np.ndarray:
    from data_tools.partitioners.metis import metis_partition
    return metis_partition(g.indptr, g.indices, parts, seed=seed)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="g3mpi.bench.schedules", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", help="existing partition directory (one part per rank)")
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--edge-factor", type=int, default=16)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--partitioner", choices=("metis", "random"), default="metis")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--sim-net", default="10Gbit,20us")
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--chunk-rows", type=int, default=0)
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    from g3mpi.format import read_meta, read_part
    from g3mpi.train import Trainer, TrainConfig

    tmp = None
    parts = a.parts
    if not parts:
        if comm.rank == 0:
            from data_tools.build import write_partition
            tmp = Path(tempfile.mkdtemp(prefix="g3bench."))
            g = rmat_graph(a.scale, a.edge_factor, a.features, a.classes)
            asg = (metis_assignment(g, comm.size) if a.partitioner == "metis" and comm.size > 1
                   else np.random.default_rng(0).integers(0, comm.size, g.num_nodes))
            meta = write_partition(g, asg, comm.size, tmp / "parts", method=a.partitioner, seed=0)
            q = meta["quality"]
            print(f"graph: RMAT scale {a.scale}, {g.num_nodes} nodes, {g.num_edges} edges, {a.features} features; "
                  f"{a.partitioner} into {comm.size}: edge cut {q['edge_cut']}, replication "
                  f"{q['replication_factor']:.3f}", flush=True)
            parts = str(tmp / "parts")
        parts = comm.bcast(parts, root=0)
    meta = read_meta(parts)
    part = read_part(parts, comm.rank, meta)
    schedules = a.schedules.split(",")
    trainers = {}
    for s in schedules:
        cfg = TrainConfig(parts=parts, out="", model=a.model, layers=a.layers, hidden=a.hidden, heads=a.heads,
                          dropout=a.dropout, schedule=s, sim_net=a.sim_net, chunk_rows=a.chunk_rows,
                          progress=False, activation="elu" if a.model == "gat" else "relu")
        trainers[s] = Trainer(cfg, comm, part, meta)
    rec = {s: [] for s in schedules}
    for ep in range(1, a.epochs + 1):
        for s in schedules:
            r = trainers[s].train_step(ep)
            allr = comm.gather(r, root=0)
            if comm.rank == 0 and ep > 1:
                rec[s].append(dict(epoch=max(x["epoch_time_s"] for x in allr),
                                   compute=max(x["compute_s"] for x in allr),
                                   blocked=max(x["blocked_s"] for x in allr),
                                   comm=max(x["comm_s"] for x in allr),
                                   overlap=min((x["overlap"] for x in allr if x["overlap"] is not None), default=None),
                                   bytes=sum(x["bytes_sent"] for x in allr), loss=r["loss"]))
    for t in trainers.values():
        t.close()
    if comm.rank == 0:
        med = {}
        print(f"{a.model} {a.layers}x{a.hidden}, {comm.size} ranks, sim-net {a.sim_net or 'off'}, "
              f"medians of {a.epochs - 1} epochs (slowest rank per epoch):")
        for s in schedules:
            m = lambda k: statistics.median([r[k] for r in rec[s] if r[k] is not None] or [float("nan")])  # noqa
            med[s] = m("epoch")
            print(f"  {s:9s} epoch {m('epoch'):.4f}s  compute {m('compute'):.4f}s  blocked {m('blocked'):.4f}s  "
                  f"comm {m('comm'):.4f}s  overlap {m('overlap'):.3f}  bytes/epoch {m('bytes'):.0f}  "
                  f"loss {rec[s][-1]['loss']:.4f}" + ("  (invalid: no exchange)" if s == "nocomm" else ""))
        if "pipelined" in med and "blocking" in med:
            print(f"  pipelined / blocking = {med['pipelined'] / med['blocking']:.3f}")
        if "pipelined" in med and "nocomm" in med:
            print(f"  pipelined / nocomm   = {med['pipelined'] / med['nocomm']:.3f}")
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
