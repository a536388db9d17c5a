"""2-rank A/B of the schedules' nothing-to-hide case: one Trainer per rank (GCN 3 x 128, input cache off, dropout 0),
pipelined and blocking epochs interleaved (ABAB, BABA, ...) in the same processes, each epoch timed between
barriers (max over ranks: wall; process_time: CPU). The parts are g3-bench schedules' own (SBM 100k / 2M,
64 -> 128 -> 128 -> 16, METIS 2 parts balanced by edges: ``g3mpi.bench.common.prepare_graph/prepare_parts``).

    PARTS=DIR [ROUNDS=6] [SIMNET=1Gbit,50us] [TIMERS=1] mpiexec -n 2 -bind-to core python schedules_ab.py
"""
import sys, time, statistics, os
import torch
from mpi4py import MPI
from g3mpi.train.config import TrainConfig
from g3mpi.train.trainer import Trainer
from g3mpi.format import read_meta, read_part
from g3mpi.train.startup import start_up_sums
from g3mpi.mpi.watchdog import Watchdog
parts = os.environ.get("PARTS", "/tmp/precs/work/sbm-n100000-e2000000-f64-c16-s0.metis2.edges")
rounds = int(os.environ.get("ROUNDS", "6")); simnet = os.environ.get("SIMNET", "")
model = os.environ.get("MODEL", "gcn"); prof = os.environ.get("PROF", "")
comm = MPI.COMM_WORLD
meta = read_meta(parts); part = read_part(parts, comm.rank, meta)
cfg = TrainConfig(parts=parts, out="", model=model, hidden=128, layers=3, dropout=0.0, weight_decay=0, lr=0.01,
                  progress=False, epochs=1000, timeline_epoch=0, verify=False, input_cache=False, sim_net=simnet)
ss, _ = start_up_sums(part, Watchdog(comm, 0))
tr = Trainer(cfg, comm, part, meta, ss, release_edges=False)
modes = ["pipelined", "blocking"]
import collections
TT = collections.defaultdict(float); NN = collections.defaultdict(int)
if os.environ.get("TIMERS"):
    import g3mpi.ops.blocks as B_, g3mpi.ops.pipeline as P_, g3mpi.ops.aggregate as A_, g3mpi.ops.exchange as E_
    def wrap(mod, name, label):
        f = getattr(mod, name)
        def g(*a, **k):
            t = time.process_time(); r = f(*a, **k); TT[label] += time.process_time() - t; NN[label] += 1; return r
        setattr(mod, name, g)
    wrap(B_, "piece_product", "piece_product")
    wrap(P_, "piece_product", "piece_product"); wrap(A_, "piece_product", "piece_product")
    wrap(P_, "_product", "pipe_local_product"); wrap(P_, "_neighbour_products", "pipe_neighbour_products(all)")
    wrap(A_, "spmm", "agg_spmm"); 
    for cls, lab in ((P_._LocalB, "LocalB"), (P_._LocalI, "LocalI"), (A_._Local, "Local"), (E_._Add, "Add"), (E_._Start, "Start")):
        for meth in ("forward", "backward"):
            f = getattr(cls, meth)
            def mk(f, l):
                def g(*a, **k):
                    t = time.process_time(); r = f(*a, **k); TT[l] += time.process_time() - t; NN[l] += 1; return r
                return staticmethod(g)
            setattr(cls, meth, mk(f, f"{lab}.{meth}"))
    wrap(E_.HaloRound, "add_received", "add_received")
e = 1
for m in modes:
    tr.use_schedule(m); tr.train_step(e); e += 1
TM = {m: [] for m in modes}; ts = {m: [] for m in modes}; cs = {m: [] for m in modes}
for r in range(rounds):
    for m in (modes if r % 2 == 0 else modes[::-1]):
        tr.use_schedule(m); TT.clear(); NN.clear()
        comm.Barrier(); t0 = time.perf_counter(); c0 = time.process_time(); tr.train_step(e); e += 1
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        cs[m].append(comm.allreduce(time.process_time() - c0, op=MPI.MAX))
        ts[m].append(dt)
        if os.environ.get("TIMERS") and comm.rank == 0:
            TM[m].append(dict(TT))
if os.environ.get("TPROF"):
    from torch.profiler import profile, ProfilerActivity
    for m in modes:
        tr.use_schedule(m)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(2):
                tr.train_step(e); e += 1
        if comm.rank == 0:
            print("=== TPROF", m); print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=int(os.environ["TPROF"])))
if prof:
    import cProfile, pstats
    for m in modes:
        tr.use_schedule(m)
        pr = cProfile.Profile(); comm.Barrier(); pr.enable(); tr.train_step(e); e += 1; pr.disable()
        if comm.rank == 0:
            print("=== PROFILE", m); pstats.Stats(pr).sort_stats("tottime").print_stats(int(prof))
if comm.rank == 0:
    med = {m: statistics.median(v) for m, v in ts.items()}
    rat = [a / b for a, b in zip(ts["pipelined"], ts["blocking"])]
    if TM["pipelined"]:
        for m in modes:
            keys = sorted(set().union(*TM[m]))
            print(m, {k: round(statistics.median(d.get(k, 0) for d in TM[m]) * 1e3, 1) for k in keys})
    print("times", {m: [round(x, 3) for x in v] for m, v in ts.items()})
    print(f"RESULT {model} simnet={simnet or 'none'} pipelined {med['pipelined']:.3f} blocking {med['blocking']:.3f} "
          f"cpu {statistics.median(cs['pipelined']):.3f}/{statistics.median(cs['blocking']):.3f}={statistics.median(cs['pipelined'])/statistics.median(cs['blocking']):.3f} ratio_of_medians {med['pipelined']/med['blocking']:.3f} median_pair_ratio {statistics.median(rat):.3f} load {os.getloadavg()[0]:.2f}")
