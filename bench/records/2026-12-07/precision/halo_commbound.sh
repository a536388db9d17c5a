#!/bin/bash
# fp32 vs 16-bit halos, 2 ranks bound to cores, --sim-net 1Gbit,50us, on a graph made to be communication-bound:
# SBM 200k nodes, avg degree 8, 64 features, random 2 parts (nearly every other rank's row is a halo row), GCN
# 4 x 64 (three 64-wide exchanges each way). "nonet": the same fp32 run without the simulated network (its
# compute alone). Order alternates per round. Usage: halo_commbound.sh PARTS OUT [ROUNDS]
P=$1; OUT=$2; R=${3:-2}; mkdir -p $OUT
one() {  # name halo-dtype sim-net
  mpiexec -n 2 -bind-to core g3-train --parts $P --out $OUT/r-$1-$rep --force --no-progress --no-plots --model gcn \
    --layers 4 --hidden 64 --dropout 0 --epochs 6 --halo-dtype $2 ${3:+--sim-net $3} --log-level WARNING \
    >/dev/null 2>&1 || echo FAIL $1
  python -c "import json,os;d=json.load(open('$OUT/r-$1-$rep/summary.json'));print('$1', $rep, round(d['epoch_time_median_s'],4), d['bytes_sent_per_epoch'], round(d.get('blocked_time_median_s') or 0,4), d['test_acc'], 'load', os.getloadavg()[0])"
}
for rep in $(seq 1 $R); do
  if [ $((rep % 2)) = 1 ]; then order="float32 bfloat16 float16 nonet"; else order="nonet float16 bfloat16 float32"; fi
  for h in $order; do
    if [ $h = nonet ]; then one nonet float32 ""; else one $h $h 1Gbit,50us; fi
  done
done
