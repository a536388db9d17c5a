#!/bin/sh
# g3-bench memory for GCN, APPNP (K = 10) and GCNII (L = 2) side by side: SBM 100k nodes / 2M edges, 128 -> 256 -> 40,
# 2 ranks, dropout 0.5, 1 measured epoch; code of bf71124 (the memory model's APPNP and GCNII terms).
set -e
g3-bench memory --out "${1:-out}" --nodes 100000 --edges 2000000 --dims 128,256,40 --epochs 1 \
    --models gcn,appnp,gcn2 --no-plots
