"""Issue 51: R-GCN's epoch against GCN's on the same partition, in one process per rank, step by step
alternating (odd steps gcn, rgcn, rgcn-seg; even steps the reverse), so that the machine's load falls on all of
them alike. ``rgcn-seg``: R-GCN with the remat segment of before 82f6202 (ending at the [n, R out] messages:
``wide_pre`` off on its layers). g3-train's defaults otherwise (pipelined, --remat cheap, dropout 0.5), 2 layers
of 16. Step 1 is a warm-up and is not counted.

    mpiexec -n 2 -bind-to core python -m mpi4py ab_epoch.py PARTS STEPS OUT.json [VARIANTS]

VARIANTS: comma-separated, of gcn (always), rgcn, rgcn-seg, rgcn-fresh (default gcn, rgcn, rgcn-seg).
``rgcn-fresh``: R-GCN with its messages and their gradients allocated afresh every step (as before "rgcn:
per-relation messages and their gradients in reused storage": no ``ScratchPool`` reuse)."""
import json
import os
import statistics as st
import sys
import time

import torch
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.nn.rgcn import RGCNLayer
from g3mpi.train import TrainConfig, Trainer
from g3mpi.train.startup import read_rank_part, start_up_sums

parts, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
wanted = ["gcn"] + [v for v in (sys.argv[4] if len(sys.argv) > 4 else "rgcn,rgcn-seg").split(",") if v != "gcn"]
comm = MPI.COMM_WORLD
torch.set_num_threads(1)
meta, part = read_rank_part(parts, comm, verify=False)
sizes, _ = start_up_sums(part, Watchdog(comm, 0))
tr = {}
for name, model in (("gcn", "gcn"), ("rgcn", "rgcn"), ("rgcn-seg", "rgcn"), ("rgcn-fresh", "rgcn")):
    if name not in wanted:
        continue
    cfg = TrainConfig(parts=parts, out="", model=model, layers=2, hidden=16, epochs=steps + 2, verify=False,
                      progress=False)
    tr[name] = Trainer(cfg, comm, part, meta, sizes)
for m in tr["rgcn-seg"].model.modules() if "rgcn-seg" in tr else ():
    if isinstance(m, RGCNLayer):
        m.wide_pre = False
if "rgcn-fresh" in tr:
    class Fresh:
        def empty(self, shape, dtype=torch.float32):
            return torch.empty(shape, dtype=dtype)
    tr["rgcn-fresh"].graph.scratch = Fresh()
times = {m: [] for m in tr}
order = list(tr)
for ep in range(1, steps + 2):
    for m in (order if ep % 2 else order[::-1]):
        comm.Barrier()
        t0 = time.perf_counter()
        tr[m].train_step(ep)
        comm.Barrier()
        if ep > 1:
            times[m].append(time.perf_counter() - t0)
if comm.rank == 0:
    r = {m: dict(median_s=st.median(v), min_s=min(v), steps_s=[round(x, 3) for x in v]) for m, v in times.items()}
    res = dict(parts=parts, ranks=comm.size, steps=steps, load_average_after=os.getloadavg(), runs=r,
               ratio_rgcn_over_gcn=dict(median=r["rgcn"]["median_s"] / r["gcn"]["median_s"],
                                        min=r["rgcn"]["min_s"] / r["gcn"]["min_s"],
                                        per_step=[a / b for a, b in zip(times["rgcn"], times["gcn"])]))
    if "rgcn-seg" in r:
        res["ratio_rgcn_seg_over_gcn"] = dict(median=r["rgcn-seg"]["median_s"] / r["gcn"]["median_s"],
                                              min=r["rgcn-seg"]["min_s"] / r["gcn"]["min_s"])
    if "rgcn-fresh" in r:
        res["ratio_rgcn_fresh_over_gcn"] = dict(median=r["rgcn-fresh"]["median_s"] / r["gcn"]["median_s"],
                                                min=r["rgcn-fresh"]["min_s"] / r["gcn"]["min_s"])
        res["ratio_rgcn_over_rgcn_fresh"] = dict(
            median=r["rgcn"]["median_s"] / r["rgcn-fresh"]["median_s"],
            per_step=[a / b for a, b in zip(times["rgcn"], times["rgcn-fresh"])])
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))
