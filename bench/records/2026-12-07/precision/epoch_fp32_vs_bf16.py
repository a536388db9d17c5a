import sys, time, torch
from mpi4py import MPI
from g3mpi.train.config import TrainConfig
from g3mpi.train.trainer import Trainer
from g3mpi.format import read_meta, read_part
from g3mpi.train.startup import start_up_sums
from g3mpi.mpi.watchdog import Watchdog
prec = sys.argv[1]; model = sys.argv[2] if len(sys.argv) > 2 else "gcn"
parts = "/tmp/prec/work/sbm-n200000-e4000000-f128-c40-s0.metis1"
comm = MPI.COMM_WORLD
meta = read_meta(parts); part = read_part(parts, 0, meta)
cfg = TrainConfig(parts=parts, out="", model=model, hidden=256 if model != "gat" else 32, layers=2, precision=prec, dropout=float(sys.argv[3]), progress=False, epochs=10, timeline_epoch=0, weight_decay=0, verify=False)
ss, _ = start_up_sums(part, Watchdog(comm, 0))
tr = Trainer(cfg, comm, part, meta, ss)
for e in range(2): tr.train_step(e+1)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    t0=time.perf_counter(); tr.train_step(3); print(prec, "epoch", time.perf_counter()-t0)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
ts=[]
for e in range(3):
    t0=time.perf_counter(); tr.train_step(4+e); ts.append(time.perf_counter()-t0)
print("RESULT", prec, model, sys.argv[3], min(ts))
