#!/bin/bash
# Peak RSS of fp32 vs bf16-mixed, GCN 2 x 256, SBM 200k / 4M (128 features, 40 classes), 1 rank, 3 epochs,
# dropout 0.5 (g3-train's default), with and without --release-memory; launches alternate.
# Usage: rss_gcn.sh PARTS OUT
P=$1; OUT=$2; mkdir -p $OUT
for rel in "" --release-memory; do for v in fp32 bf16-mixed bf16-mixed fp32; do
  g3-train --parts $P --out $OUT/r --force --no-progress --no-plots --model gcn --hidden 256 --layers 2 --epochs 3 \
    --precision $v --timeline-epoch 0 $rel --log-level WARNING >/dev/null 2>&1 || echo FAIL $v
  python -c "import json;d=json.load(open('$OUT/r/summary.json'));print('$v', '${rel:-default}', d['peak_rss_bytes_max'], round(d['peak_rss_bytes_max']/200000), 'B/owned row')"
done; done
