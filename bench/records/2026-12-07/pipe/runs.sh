#!/bin/sh
# Three g3-bench schedules runs in a row, each measuring both networks side by side (none, 1Gbit,50us).
# OUT: where run1..run3 go (default: beside this script); WORK: the generated graph and parts (kept between runs).
set -e
OUT=${OUT:-$(dirname "$0")}
for i in 1 2 3; do
  g3-bench schedules --out "$OUT/run$i" --work "${WORK:-/tmp/pipe/work}" --graph sbm --nodes 100000 \
    --edges 2000000 --dims 64,128,128,16 --ranks 2 --bind-to core --models gcn --sim-net none --sim-net 1Gbit,50us \
    --epochs 7 --no-plots
done
