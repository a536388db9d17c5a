#!/bin/bash
# GCN and SAGE 2 x 64, dropout 0.5, 2 ranks on R-MAT 20 (1.05M nodes), --remat none vs cheap, alternating.
source /work/main/.venv/bin/activate
cd /tmp/m41
for rep in 1 2; do
  for model in gcn sage; do
    for r in none cheap; do
      mpiexec -n 2 -bind-to core g3-train --parts /tmp/m41/p2 --out /tmp/m41/m-$model-$r-$rep --model $model --layers 2 \
        --hidden 64 --dropout 0.5 --epochs 5 --eval-every 5 --no-plots --timeline-epoch 0 --force --no-progress \
        --remat $r 2>&1 | tail -1
    done
  done
done
python - <<'PY'
import json
meta = json.load(open('/tmp/m41/p2/meta.json'))
owned = [p['owned'] for p in meta['parts']]
base = 356 << 20
out = {}
for model in ('gcn', 'sage'):
    for r in ('none', 'cheap'):
        runs = [json.load(open(f'/tmp/m41/m-{model}-{r}-{rep}/summary.json')) for rep in (1, 2)]
        peaks = [max(s['rank_peak_rss_bytes']) for s in runs]
        per_row = [max((p - base) / o for p, o in zip(s['rank_peak_rss_bytes'], owned)) for s in runs]
        ep = [s['epoch_time_median_s'] for s in runs]
        out[f'{model}-{r}'] = dict(peak_rss_bytes_max=peaks, bytes_per_owned_row=[round(x) for x in per_row],
                                   epoch_time_median_s=ep, final_loss=[s['final_loss'] for s in runs])
        print(model, r, 'peak MiB', [p >> 20 for p in peaks], 'B/owned row', [round(x) for x in per_row], 'epoch s', [round(e, 3) for e in ep], 'loss', [s['final_loss'] for s in runs])
for model in ('gcn', 'sage'):
    a, b = out[f'{model}-none'], out[f'{model}-cheap']
    out[f'{model}-ratio'] = dict(bytes_per_owned_row=min(b['bytes_per_owned_row']) / min(a['bytes_per_owned_row']),
                                 epoch_time=min(b['epoch_time_median_s']) / min(a['epoch_time_median_s']))
    print(model, 'cheap/none per row', round(out[f'{model}-ratio']['bytes_per_owned_row'], 3), 'epoch', round(out[f'{model}-ratio']['epoch_time'], 3))
out['graph'] = '/tmp/p37/rmat20.h5 (R-MAT 20, EF 16, symmetrized, F 32, C 8), 2 parts kaminpar+g3'
out['parts_owned'] = owned
out['baseline_bytes'] = base
json.dump(out, open('/tmp/m41/remat-rmat20-2ranks.json', 'w'), indent=1)
PY
