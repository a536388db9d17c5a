"""CPU time (process_time, 1 thread, best of 5) of the products the deferred weight gradients take off the pipelined
backward's critical path on g3-bench schedules' graph (SBM 100k / 2M, 2 ranks: 48024 boundary rows, GCN
64 -> 128 -> 128 -> 16): layer 1's and layer 2's weight products, with the input product that stays for scale.

    OMP_NUM_THREADS=1 python removed_products.py
"""
import time

import torch

torch.set_num_threads(1)


def best(f, n=5):
    f()
    ts = []
    for _ in range(n):
        c = time.process_time()
        f()
        ts.append(time.process_time() - c)
    return min(ts) * 1e3


x, g, w, g16 = torch.randn(48024, 128), torch.randn(48024, 128), torch.randn(128, 128), torch.randn(48024, 16)
print(f"layer 1 weight product g^T x [48024 x 128]^T [48024 x 128]: {best(lambda: g.t().mm(x)):.1f} ms (deferred)")
print(f"layer 2 weight product [48024 x 16]^T [48024 x 128]: {best(lambda: g16.t().mm(x)):.1f} ms (deferred)")
print(f"layer 1 input product g W (stays before the send): {best(lambda: g.mm(w)):.1f} ms")
