#!/bin/bash
# R-MAT 20 link prediction against node classification of the same encoder (issue 50 item 5): 2 ranks, GCN 2 x 64
# (input 32 features, output 64: the link embedding, or 64 classes), 1 sampled negative per positive, alternating
# link / node runs (separate processes: each its own peak RSS), 3 measured epochs after a warm-up each.
set -e
W=${W:-/tmp/lr}
source /work/main/.venv/bin/activate
export OMP_NUM_THREADS=1
if [ ! -f $W/q2/meta.json ]; then
  g3-prepare rmat --scale 20 --edge-factor 16 --feature-dim 32 --classes 64 --symmetrize --seed 0 \
    --link-split 0.85,0.05,0.1 --split-seed 0 --out $W/rmat20c64.h5 --force --quiet
  g3-partition $W/rmat20c64.h5 --parts 2 --out $W/q2 --force --no-progress
fi
HERE=$(cd $(dirname $0)/../../../.. && pwd)
for rep in ${REPS:-1 2}; do
  for task in multiclass link; do
    mpiexec -n 2 -bind-to core python -m mpi4py $HERE/bench/link_epoch.py --parts $W/q2 --task $task --epochs 3 \
      --json $W/bench-$task-$rep.json 2>&1 | grep -v Warning | tail -1
  done
done
python - "$W" ${REPS:-1 2} <<'PY'
import json, sys
W, reps = sys.argv[1], sys.argv[2:]
runs = {t: [json.load(open(f"{W}/bench-{t}-{r}.json")) for r in reps] for t in ("multiclass", "link")}
node = min(r["epoch_time_median_s"] for r in runs["multiclass"])
link = min(r["epoch_time_median_s"] for r in runs["link"])
out = dict(graph="R-MAT 20 (EF 16, symmetrized, F 32, 64 classes), link split 0.85/0.05/0.1, 2 parts kaminpar+g3",
           node_epoch_s=node, link_epoch_s=link, link_over_node=link / node,
           pair_bytes_ratio=[r["pair_bytes_ratio"] for r in runs["link"]],
           pair_bytes_sent=runs["link"][0]["pair_bytes_sent"],
           pair_bytes_lower_bound=runs["link"][0]["pair_bytes_lower_bound"],
           peak_rss_MiB={t: [[x["peak_rss_bytes"] >> 20 for x in r["ranks"]] for r in v] for t, v in runs.items()},
           model_peak_MiB={t: [x["model_peak_bytes"] >> 20 for x in v[0]["ranks"]] for t, v in runs.items()},
           pairs_term_MiB=[x["model_pairs_bytes"] >> 20 for x in runs["link"][0]["ranks"]],
           peak_over_model={t: [round(x["peak_over_model"], 3) for x in v[0]["ranks"]] for t, v in runs.items()},
           epochs={t: [r["epoch_time_s"] for r in v] for t, v in runs.items()})
print(json.dumps(out, indent=1))
json.dump(out, open(f"{W}/rmat20-link-vs-node-2ranks.json", "w"), indent=1)
PY
