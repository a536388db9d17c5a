#!/bin/bash
# R-MAT 24 / EF 16 (16.8M nodes, 268M directed edges, F 32, C 8) end to end on one machine: prepared out of core
# (1 process), partitioned into 2 parts by the stream method on 4 ranks, trained on 2 ranks bound to cores (GCN
# 2 x 16, 3 epochs, --remat cheap). Peak RSS: g3-prepare's own stage records (prepare.json), one
# data_tools.peak_rss record per partitioner rank (rss-partition/), g3-train's summary.json. Stages whose output
# is in $W already are skipped.
set -euo pipefail
W=${W:-/tmp/r24}
source /work/main/.venv/bin/activate
mkdir -p "$W" && cd "$W"
[ -f graph.h5 ] || /usr/bin/time -v g3-prepare rmat --scale 24 --edge-factor 16 --feature-dim 32 --classes 8 \
  --out graph.h5 --memory-budget 256M --quiet > prepare.json 2> prepare.time
[ -f p2/meta.json ] || /usr/bin/time -v mpiexec -n 4 python -m data_tools.peak_rss rss-partition \
  python -m mpi4py -m data_tools.partition graph.h5 --method stream --parts 2 --out p2 --no-progress \
  > partition.log 2> partition.time
mpiexec -n 2 -bind-to core g3-train --parts p2 --out train --model gcn --layers 2 --hidden 16 --epochs 3 \
  --eval-every 3 --no-plots --timeline-epoch 0 --force --no-progress --remat cheap 2>&1 | tail -1
python - "$W" <<'PY'
import json, sys
from pathlib import Path
W = Path(sys.argv[1])
prep = json.loads((W / 'prepare.json').read_text())
part = [json.loads(p.read_text()) for p in sorted((W / 'rss-partition').glob('*.json'))]
train = json.loads((W / 'train' / 'summary.json').read_text())
out = dict(graph=dict(num_nodes=prep['num_nodes'], num_edges=prep['num_edges']),
           prepare=dict(seconds=prep['seconds'], peak_rss_mib=max(s['peak_rss_bytes'] for s in prep['stages']) >> 20),
           partition=dict(seconds=max(r.get('seconds', r.get('wall_seconds', 0)) for r in part),
                          rank_peak_rss_mib=[r['peak_rss_bytes'] >> 20 for r in part],
                          summed_peak_rss_mib=sum(r['peak_rss_bytes'] for r in part) >> 20),
           train=dict(rank_peak_rss_mib=[p >> 20 for p in train['rank_peak_rss_bytes']],
                      summed_peak_rss_mib=sum(train['rank_peak_rss_bytes']) >> 20,
                      epoch_time_median_s=train['epoch_time_median_s'], final_loss=train['final_loss']))
print(json.dumps(out, indent=1))
(W / 'rmat24-end-to-end.json').write_text(json.dumps(out, indent=1))
PY
