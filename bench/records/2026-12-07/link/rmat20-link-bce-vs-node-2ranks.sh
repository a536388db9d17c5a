#!/bin/bash
# R-MAT 20 link prediction against node classification of the same encoder (issue 50 item 5), dot decoder scored
# with its BCE gradient made in forward (g3mpi.ops.pairs.SampledDotBCE), otherwise as
# in rmat20-link-fused-vs-node-2ranks.sh: 2 ranks bound to cores, GCN 2 x 64 (input 32
# features, output 64: the link embedding, or 64 classes), 1 sampled negative per positive (planned every epoch,
# inside the timed epoch), 3 measured epochs after a warm-up each, separate processes (each its own peak RSS),
# rounds alternating the order (node first, then link first, ...); the load average before each run is recorded.
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
REPS=${REPS:-1 2 3}
for rep in $REPS; do
  order="multiclass link"; [ $((rep % 2)) -eq 0 ] && order="link multiclass"
  for task in $order; do
    cut -d' ' -f1 /proc/loadavg > $W/load-$task-$rep.txt
    mpiexec -n 2 -bind-to core python -m mpi4py $HERE/bench/link_epoch.py --parts $W/q2 --task $task --epochs 3 \
      --json $W/bce-$task-$rep.json 2>&1 | grep -v Warning | tail -1 | cut -c1-200
  done
done
python - "$W" $REPS <<'PY'
import json, sys
W, reps = sys.argv[1], sys.argv[2:]
runs = {t: [json.load(open(f"{W}/bce-{t}-{r}.json")) for r in reps] for t in ("multiclass", "link")}
load = {t: [float(open(f"{W}/load-{t}-{r}.txt").read()) for r in reps] for t in runs}
rounds = [dict(round=int(r), node_epoch_s=n["epoch_time_median_s"], link_epoch_s=l["epoch_time_median_s"],
               link_over_node=l["epoch_time_median_s"] / n["epoch_time_median_s"],
               load_before={"node": load["multiclass"][i], "link": load["link"][i]})
          for i, (r, n, l) in enumerate(zip(reps, runs["multiclass"], runs["link"]))]
out = dict(graph="R-MAT 20 (EF 16, symmetrized, F 32, 64 classes), link split 0.85/0.05/0.1, 2 parts kaminpar+g3",
           decoder="dot, fused with its BCE gradient (sampled_addmm, CSR products in forward)", rounds=rounds,
           link_over_node_per_round=[round(x["link_over_node"], 3) for x in rounds],
           pair_bytes_ratio=[r["pair_bytes_ratio"] for r in runs["link"]],
           pair_bytes_sent=runs["link"][0]["pair_bytes_sent"],
           pair_bytes_lower_bound=runs["link"][0]["pair_bytes_lower_bound"],
           pairs_per_rank=[x["epochs"][-1]["pairs"] for x in runs["link"][0]["ranks"]],
           peak_rss_MiB={t: [[x["peak_rss_bytes"] >> 20 for x in r["ranks"]] for r in v] for t, v in runs.items()},
           model_peak_MiB={t: [x["model_peak_bytes"] >> 20 for x in v[0]["ranks"]] for t, v in runs.items()},
           pairs_term_MiB=[x["model_pairs_bytes"] >> 20 for x in runs["link"][0]["ranks"]],
           peak_over_model={t: [[round(x["peak_over_model"], 3) for x in r["ranks"]] for r in v]
                            for t, v in runs.items()},
           epochs={t: [r["epoch_time_s"] for r in v] for t, v in runs.items()})
print(json.dumps({k: out[k] for k in ("rounds", "pair_bytes_ratio", "peak_rss_MiB", "model_peak_MiB",
                                      "peak_over_model")}, indent=1))
json.dump(out, open(f"{W}/rmat20-link-bce-vs-node-2ranks.json", "w"), indent=1)
PY
