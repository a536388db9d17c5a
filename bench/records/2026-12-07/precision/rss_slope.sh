#!/bin/bash
# Peak RSS of fp32 vs bf16-mixed at two sizes (same degree), GCN 2 x 256, 1 rank, 3 epochs, dropout 0.5 (g3-train's
# defaults); per size launches alternate fp32, bf16, bf16, fp32. The per-owned-row figure is the slope
# (peak(large) - peak(small)) / (rows(large) - rows(small)) of each precision (medians of its two launches), so the
# interpreter, torch and the parameters (the same at both sizes) drop out.
# Usage: [REL=--release-memory] rss_slope.sh PARTS_SMALL ROWS_SMALL PARTS_LARGE ROWS_LARGE OUT
PS=$1; NS=$2; PL=$3; NL=$4; OUT=$5; mkdir -p $OUT; : > $OUT/rss.txt
for sz in "$PS $NS" "$PL $NL"; do set -- $sz; for v in fp32 bf16-mixed bf16-mixed fp32; do
  g3-train --parts $1 --out $OUT/r --force --no-progress --no-plots --model gcn --hidden 256 --layers 2 --epochs 3 \
    --precision $v --timeline-epoch 0 $REL --log-level WARNING >/dev/null 2>&1 || echo FAIL $v
  python -c "import json;d=json.load(open('$OUT/r/summary.json'));print($2, '$v', d['peak_rss_bytes_max'])" >> $OUT/rss.txt
done; done
python - $OUT/rss.txt <<'PY'
import sys, collections, statistics as st
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    n, v, b = line.split(); d[(int(n), v)].append(int(b))
ns = sorted({n for n, _ in d}); s = {}
for v in ("fp32", "bf16-mixed"):
    a, b = (st.median(d[(n, v)]) for n in ns)
    s[v] = (b - a) / (ns[1] - ns[0])
    print(v, "peaks", {n: d[(n, v)] for n in ns}, f"slope {s[v]:.0f} B/owned row")
print(f"slope ratio bf16-mixed / fp32 {s['bf16-mixed'] / s['fp32']:.3f}x")
PY
