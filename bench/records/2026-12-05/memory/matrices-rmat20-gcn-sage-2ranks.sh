#!/bin/bash
# The checkout's code (a symmetric local block stored once, SAGE's mean as a pattern with a row scaling, message
# pieces of O(entries + rows), GCN's dropped input a column block at a time) against the code before (7c2edfa),
# side by side: GCN and SAGE 2 x 64, dropout 0.5, 2 ranks bound to cores, R-MAT 20 (EF 16, symmetrized, F 32,
# C 8) in 2 parts (default method), --remat none and cheap, the two codes alternating, two rounds. OLD: a checkout
# of 7c2edfa, put first on PYTHONPATH. Prints and writes matrices-rmat20-2ranks.json beside the runs.
set -euo pipefail
W=${W:-/tmp/m41}
OLD=${OLD:-/tmp/old}
source /work/main/.venv/bin/activate
cd "$W"
for rep in 1 2; do
  for model in gcn sage; do
    for r in none cheap; do
      for code in old new; do
        pp=""; [ "$code" = old ] && pp="$OLD"
        PYTHONPATH="$pp" mpiexec -n 2 -bind-to core python -m g3mpi.cli.train --parts "$W/p2" \
          --out "$W/s-$code-$model-$r-$rep" --model $model --layers 2 --hidden 64 --dropout 0.5 --epochs 5 \
          --eval-every 5 --no-plots --timeline-epoch 0 --force --no-progress --remat $r 2>&1 | tail -1
      done
    done
  done
done
python - "$W" <<'PY'
import json, sys
W = sys.argv[1]
meta = json.load(open(f'{W}/p2/meta.json'))
owned = [p['owned'] for p in meta['parts']]
base = 356 << 20
out = dict(graph=f'{W}/rmat20.h5 (R-MAT 20, EF 16, symmetrized, F 32, C 8), 2 parts ' + meta.get('method', '?'),
           parts_owned=owned, baseline_bytes=base, old='7c2edfa', new='the checkout')
for model in ('gcn', 'sage'):
    for r in ('none', 'cheap'):
        for code in ('old', 'new'):
            runs = [json.load(open(f'{W}/s-{code}-{model}-{r}-{rep}/summary.json')) for rep in (1, 2)]
            per_row = [max((p - base) / o for p, o in zip(s['rank_peak_rss_bytes'], owned)) for s in runs]
            row = dict(bytes_per_owned_row=[round(x) for x in per_row],
                       peak_rss_mib=[[p >> 20 for p in s['rank_peak_rss_bytes']] for s in runs],
                       epoch_time_median_s=[s['epoch_time_median_s'] for s in runs],
                       final_loss=[s['final_loss'] for s in runs])
            out[f'{model}-{r}-{code}'] = row
            print(model, r, code, 'B/owned row', row['bytes_per_owned_row'], 'epoch s',
                  [round(e, 3) for e in row['epoch_time_median_s']], 'loss', row['final_loss'])
        a, b = out[f'{model}-{r}-old'], out[f'{model}-{r}-new']
        out[f'{model}-{r}-new/old'] = dict(
            bytes_per_owned_row=round(min(b['bytes_per_owned_row']) / min(a['bytes_per_owned_row']), 3),
            epoch_time=round(min(b['epoch_time_median_s']) / min(a['epoch_time_median_s']), 3))
        print(model, r, 'new/old', out[f'{model}-{r}-new/old'])
    ref = out[f'{model}-none-old']
    cheap = out[f'{model}-cheap-new']
    out[f'{model}-cheap-new/none-old'] = dict(
        bytes_per_owned_row=round(min(cheap['bytes_per_owned_row']) / min(ref['bytes_per_owned_row']), 3),
        epoch_time=round(min(cheap['epoch_time_median_s']) / min(ref['epoch_time_median_s']), 3))
    print(model, 'cheap new / none old', out[f'{model}-cheap-new/none-old'])
json.dump(out, open(f'{W}/matrices-rmat20-2ranks.json', 'w'), indent=1)
PY
