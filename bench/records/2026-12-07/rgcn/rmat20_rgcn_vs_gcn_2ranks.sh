#!/bin/bash
# Issue 51: an epoch of R-GCN (8 relations, no decomposition) against GCN's on the same typed R-MAT 20 graph,
# 2 ranks bound to cores, the same widths (32 features -> 16 -> 16 classes, 2 layers), side by side in one
# command: odd rounds gcn then rgcn, even rounds rgcn then gcn (ROUNDS, default 2). Graph and partition as in
# the json's graph_commands.
export OMP_NUM_THREADS=1   # g3mpi installed, its venv on PATH
cd "${WORK:-.}"            # the directory holding r20t-p2
E=${EPOCHS:-5}
run() {
  /usr/bin/time -v mpiexec -n 2 -bind-to core python -m mpi4py -m g3mpi.cli.train --parts r20t-p2 \
    --out bruns/$1-p2-$2 --force --model $1 --layers 2 --hidden 16 --epochs $E --no-progress --no-plots \
    2> bruns-$1-$2.err | tail -1
  grep -E "Maximum resident|Elapsed" bruns-$1-$2.err
  python - bruns/$1-p2-$2 <<'PY'
import json, sys
ts = [json.loads(l)["epoch_time_s"] for l in open(sys.argv[1] + "/metrics.jsonl") if '"epoch_time_s"' in l]
print(sys.argv[1], "epochs", [round(t, 3) for t in ts])
PY
  uptime
}
for r in $(seq 1 ${ROUNDS:-2}); do
  if [ $((r % 2)) = 1 ]; then run gcn $r; run rgcn $r; else run rgcn $r; run gcn $r; fi
done
