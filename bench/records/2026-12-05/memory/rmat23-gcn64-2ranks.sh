#!/bin/bash
# R-MAT 23 (8.4M nodes, 134M directed edges, F 32, C 8), prepared out of core and partitioned into 2 parts by
# the stream method on 4 ranks (both kept in $W when there already), then GCN 2 x 64, dropout 0.5, 3 epochs on 2
# ranks bound to cores, --remat cheap and none. Prints each rank's peak RSS, their sum, the median epoch time.
set -euo pipefail
W=${W:-/tmp/r23}
source /work/main/.venv/bin/activate
mkdir -p "$W" && cd "$W"
[ -f graph.h5 ] || g3-prepare rmat --scale 23 --edge-factor 16 --feature-dim 32 --classes 8 --out graph.h5 \
  --memory-budget 256M --quiet
[ -f p2/meta.json ] || mpiexec -n 4 g3-partition graph.h5 --method stream --parts 2 --out p2 --no-progress
for r in cheap none; do
  mpiexec -n 2 -bind-to core g3-train --parts p2 --out "t-$r" --model gcn --layers 2 --hidden 64 --dropout 0.5 \
    --epochs 3 --eval-every 3 --no-plots --timeline-epoch 0 --force --no-progress --remat $r 2>&1 | tail -1
done
python - "$W" <<'PY'
import json, sys
W = sys.argv[1]
out = {}
for r in ('cheap', 'none'):
    s = json.load(open(f'{W}/t-{r}/summary.json'))
    out[r] = dict(rank_peak_rss_mib=[p >> 20 for p in s['rank_peak_rss_bytes']],
                  summed_peak_rss_mib=sum(s['rank_peak_rss_bytes']) >> 20,
                  epoch_time_median_s=s['epoch_time_median_s'], final_loss=s['final_loss'])
    print(r, out[r])
out['parts'] = [{k: p[k] for k in ('owned', 'halo', 'local_edges', 'cut_edges')}
                for p in json.load(open(f'{W}/p2/meta.json'))['parts']]
json.dump(out, open(f'{W}/rmat23-gcn64-2ranks.json', 'w'), indent=1)
PY
