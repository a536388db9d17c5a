#!/bin/bash
# fp32 vs 16-bit halos, 2 ranks, 1Gbit,50us, comm-bound config (SBM 20k/400k random partition, GCN 3x256)
P=/tmp/precs/sbm20k-rand2; OUT=/tmp/precs/halo; mkdir -p $OUT
for rep in 1 2 3; do for h in float32 bfloat16 float16; do
  mpiexec -n 2 g3-train --parts $P --out $OUT/r-$h-$rep --force --no-progress --no-plots --model gcn --layers 3 --hidden 256 \
    --dropout 0 --epochs 8 --halo-dtype $h --sim-net 1Gbit,50us --log-level WARNING >/dev/null 2>&1 || echo FAIL $h
  python -c "import json;d=json.load(open('$OUT/r-$h-$rep/summary.json'));print('$h', $rep, round(d['epoch_time_median_s'],4), d['bytes_sent_per_epoch'], round(d.get('blocked_time_median_s') or 0,4), d['test_acc'])"
done; done
