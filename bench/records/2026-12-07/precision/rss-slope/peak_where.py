"""Where the peak RSS of one training epoch is: a thread samples VmRSS every ms and keeps the main thread's stack
at the highest sample. python peak_where.py PARTS PREC [model]"""
import sys, os, time, threading, traceback, torch, ctypes
class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI
def mi():
    m = libc.mallinfo2(); return dict(arena=m.arena>>20, mmapped=m.hblkhd>>20, inuse=m.uordblks>>20, free=m.fordblks>>20)
from mpi4py import MPI
from g3mpi.train.config import TrainConfig
from g3mpi.train.trainer import Trainer
from g3mpi.format import read_meta, read_part
from g3mpi.train.startup import start_up_sums
from g3mpi.mpi.watchdog import Watchdog
parts, prec = sys.argv[1], sys.argv[2]; model = sys.argv[3] if len(sys.argv) > 3 else "gcn"
def rss():
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * 4096
comm = MPI.COMM_WORLD
print("imports", rss() >> 20, "MiB")
meta = read_meta(parts); part = read_part(parts, 0, meta)
ss, _ = start_up_sums(part, Watchdog(comm, 0))
print("part", rss() >> 20)
cfg = TrainConfig(parts=parts, out="", model=model, hidden=256, layers=2, precision=prec, progress=False, epochs=100,
                  timeline_epoch=0, verify=False)
tr = Trainer(cfg, comm, part, meta, ss)
print("trainer", rss() >> 20, mi())
main = threading.main_thread().ident
best = [0, None]; stop = [False]
def samp():
    while not stop[0]:
        r = rss()
        if r > best[0]:
            best[0] = r; best[1] = traceback.format_stack(sys._current_frames()[main])[-3:]; best.append(mi())
        time.sleep(0.0005)
th = threading.Thread(target=samp, daemon=True); th.start()
for ep in (1, 2, 3):
    tr.train_step(ep); print("after epoch", ep, rss() >> 20)
stop[0] = True; th.join()
print("PEAK", best[0] >> 20, "MiB at:", best[-1]); print("".join(best[1]))
