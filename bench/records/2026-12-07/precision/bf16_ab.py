"""1 rank: an fp32 and a bf16-mixed Trainer in one process (2 layers, hidden 256; GAT 8 x 32; dropout 0), epochs
alternated (ABAB, BABA, ...) so both see the same load; median wall and CPU (process_time) ratios. PARTS: the
precision suite's graph (SBM 200k / 4M, 128 -> 256 -> 40, one part).

    PARTS=DIR python bf16_ab.py gcn|sage|gat [ROUNDS]
"""
import sys, time, statistics, os, resource
from mpi4py import MPI
from g3mpi.train.config import TrainConfig
from g3mpi.train.trainer import Trainer
from g3mpi.format import read_meta, read_part
from g3mpi.train.startup import start_up_sums
from g3mpi.mpi.watchdog import Watchdog
model = sys.argv[1]; rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
parts = os.environ.get("PARTS", "/tmp/prec/work/sbm-n200000-e4000000-f128-c40-s0.metis1")
comm = MPI.COMM_WORLD
meta = read_meta(parts); part = read_part(parts, 0, meta)
ss, _ = start_up_sums(part, Watchdog(comm, 0))
trs = {}
for prec in ("fp32", "bf16-mixed"):
    cfg = TrainConfig(parts=parts, out="", model=model, hidden=256 if model != "gat" else 32, layers=2, precision=prec,
                      dropout=0.0, progress=False, epochs=100, timeline_epoch=0, weight_decay=0, verify=False)
    trs[prec] = Trainer(cfg, comm, part, meta, ss, release_edges=False)
    trs[prec].train_step(1); trs[prec].train_step(2)
w = {p: [] for p in trs}; c = {p: [] for p in trs}; e = 3
for r in range(rounds):
    for p in (list(trs) if r % 2 == 0 else list(trs)[::-1]):
        t0, c0 = time.perf_counter(), time.process_time(); trs[p].train_step(e); e += 1
        w[p].append(time.perf_counter() - t0); c[p].append(time.process_time() - c0)
m = {p: statistics.median(v) for p, v in w.items()}; mc = {p: statistics.median(v) for p, v in c.items()}
print(f"RESULT {model} fp32 {m['fp32']:.3f}s bf16 {m['bf16-mixed']:.3f}s wall {m['bf16-mixed']/m['fp32']:.3f}x "
      f"cpu {mc['bf16-mixed']/mc['fp32']:.3f}x pair-median {statistics.median(b/a for a,b in zip(w['fp32'], w['bf16-mixed'])):.3f}x load {os.getloadavg()[0]:.2f}")
