#!/bin/bash
# The part's local CSR dropped after the first training forward: GCN and SAGE 2 x 64 with --remat cheap, this
# checkout against the code before it (PREV, a checkout of 69a38f5) and against the issue's starting point with
# its default (REF, a checkout of 7c2edfa, --remat none), alternating, two rounds; R-MAT 20 (EF 16, symmetrized,
# F 32, C 8) in 2 parts, 2 ranks bound to cores, dropout 0.5, 5 epochs. Prints and writes
# release-rmat20-2ranks.json beside the runs.
set -euo pipefail
W=${W:-/tmp/m41}
PREV=${PREV:-/tmp/old}
REF=${REF:-/tmp/old41}
source /work/main/.venv/bin/activate
cd "$W"
for rep in 1 2; do
  for model in gcn sage; do
    for run in ref-none prev-cheap new-cheap; do
      code=${run%-*}; r=${run#*-}
      pp=""; [ "$code" = prev ] && pp="$PREV"; [ "$code" = ref ] && pp="$REF"
      PYTHONPATH="$pp" mpiexec -n 2 -bind-to core python -m g3mpi.cli.train --parts "$W/p2" \
        --out "$W/rel-$model-$run-$rep" --model $model --layers 2 --hidden 64 --dropout 0.5 --epochs 5 \
        --eval-every 5 --no-plots --timeline-epoch 0 --force --no-progress --remat $r 2>&1 | tail -1
    done
  done
done
python - "$W" <<'PY'
import json, statistics, sys
W = sys.argv[1]
meta = json.load(open(f'{W}/p2/meta.json'))
owned = [p['owned'] for p in meta['parts']]
base = 356 << 20
out = dict(graph='R-MAT 20 (EF 16, symmetrized, F 32, C 8), 2 parts ' + meta.get('method', '?'), parts_owned=owned,
           baseline_bytes=base, ref='7c2edfa --remat none', prev='69a38f5 --remat cheap', new='the checkout, cheap')
for model in ('gcn', 'sage'):
    for run in ('ref-none', 'prev-cheap', 'new-cheap'):
        runs = [json.load(open(f'{W}/rel-{model}-{run}-{rep}/summary.json')) for rep in (1, 2)]
        per_row = [max((p - base) / o for p, o in zip(s['rank_peak_rss_bytes'], owned)) for s in runs]
        out[f'{model}-{run}'] = dict(bytes_per_owned_row=[round(x) for x in per_row],
                                     peak_rss_mib=[[p >> 20 for p in s['rank_peak_rss_bytes']] for s in runs],
                                     epoch_time_median_s=[s['epoch_time_median_s'] for s in runs],
                                     final_loss=[s['final_loss'] for s in runs])
        print(model, run, out[f'{model}-{run}'])
    ref = out[f'{model}-ref-none']
    for run in ('prev-cheap', 'new-cheap'):
        r = out[f'{model}-{run}']
        out[f'{model}-{run}/ref-none'] = dict(
            bytes_per_owned_row=round(statistics.median(r['bytes_per_owned_row'])
                                      / statistics.median(ref['bytes_per_owned_row']), 3),
            epoch_time=round(statistics.median(r['epoch_time_median_s'])
                             / statistics.median(ref['epoch_time_median_s']), 3))
        print(model, run, '/ ref-none', out[f'{model}-{run}/ref-none'])
json.dump(out, open(f'{W}/release-rmat20-2ranks.json', 'w'), indent=1)
PY
