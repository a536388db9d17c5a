#!/bin/bash
# GAT with --remat cheap (per-edge attention terms computed again in backward) against the code before it, side
# by side: GAT 2 layers, 8 heads of 8 channels (64 wide), dropout 0.5 and attention dropout 0.5, 2 ranks bound to
# cores, R-MAT 20 (EF 16, symmetrized, F 32, C 8) in 2 parts (default method), 5 epochs; the code before (OLD, a
# checkout of 5bbb99c, put first on PYTHONPATH; GAT had no remat there) and this checkout with none and cheap,
# alternating, two rounds. Prints and writes gat-rmat20-2ranks.json beside the runs.
set -euo pipefail
W=${W:-/tmp/m41}
OLD=${OLD:-/tmp/old}
source /work/main/.venv/bin/activate
cd "$W"
for rep in 1 2; do
  for run in old-none new-none new-cheap; do
    code=${run%-*}; r=${run#*-}
    pp=""; [ "$code" = old ] && pp="$OLD"
    PYTHONPATH="$pp" mpiexec -n 2 -bind-to core python -m g3mpi.cli.train --parts "$W/p2" \
      --out "$W/gat-$run-$rep" --model gat --layers 2 --hidden 8 --heads 8 --dropout 0.5 --attn-dropout 0.5 \
      --epochs 5 --eval-every 5 --no-plots --timeline-epoch 0 --force --no-progress --remat $r 2>&1 | tail -1
  done
done
python - "$W" <<'PY'
import json, statistics, sys
W = sys.argv[1]
meta = json.load(open(f'{W}/p2/meta.json'))
owned = [p['owned'] for p in meta['parts']]
base = 356 << 20
out = dict(graph='R-MAT 20 (EF 16, symmetrized, F 32, C 8), 2 parts ' + meta.get('method', '?'),
           model='GAT 2 layers, 8 heads x 8 channels, dropout 0.5, attention dropout 0.5', parts_owned=owned,
           baseline_bytes=base, old='5bbb99c', new='the checkout')
for run in ('old-none', 'new-none', 'new-cheap'):
    runs = [json.load(open(f'{W}/gat-{run}-{rep}/summary.json')) for rep in (1, 2)]
    per_row = [max((p - base) / o for p, o in zip(s['rank_peak_rss_bytes'], owned)) for s in runs]
    out[run] = dict(bytes_per_owned_row=[round(x) for x in per_row],
                    peak_rss_mib=[[p >> 20 for p in s['rank_peak_rss_bytes']] for s in runs],
                    epoch_time_median_s=[s['epoch_time_median_s'] for s in runs],
                    final_loss=[s['final_loss'] for s in runs])
    print(run, out[run])
ref = out['old-none']
for run in ('new-none', 'new-cheap'):
    out[f'{run}/old-none'] = dict(
        bytes_per_owned_row=round(statistics.median(out[run]['bytes_per_owned_row'])
                                  / statistics.median(ref['bytes_per_owned_row']), 3),
        epoch_time=round(statistics.median(out[run]['epoch_time_median_s'])
                         / statistics.median(ref['epoch_time_median_s']), 3))
    print(run, '/ old-none', out[f'{run}/old-none'])
json.dump(out, open(f'{W}/gat-rmat20-2ranks.json', 'w'), indent=1)
PY
