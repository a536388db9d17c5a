#!/usr/bin/env bash
# Memory soak (a script, not a CI test): many epochs on a generated graph, RSS of every rank sampled every epoch
# (metrics.jsonl rank_rss_bytes), growth after warm-up must stay within 2%.
#
#   jobs/soak.sh [WORKDIR]        (default WORKDIR: ./soak)
#
# Environment: G3_SOAK_NODES (20000), G3_SOAK_EPOCHS (500), G3_SOAK_RANKS (2), G3_SOAK_WARMUP (50),
# G3_SOAK_MODEL (gcn), plus every G3_* variable of jobs/lib/common.sh (G3_PYTHON, G3_VENV, G3_MPIEXEC, ...).
# Checkpoints every 50 epochs and the watchdog (--comm-timeout 120) are on, so their memory is part of the soak.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${1:-soak}
NODES=${G3_SOAK_NODES:-20000}
EPOCHS=${G3_SOAK_EPOCHS:-500}
RANKS=${G3_SOAK_RANKS:-2}
WARMUP=${G3_SOAK_WARMUP:-50}
MODEL=${G3_SOAK_MODEL:-gcn}
mkdir -p "$WORK"

"$HERE/mpirun/launch.sh" prepare -- sbm --nodes "$NODES" --classes 8 --feature-dim 64 --avg-degree 10 \
    --symmetrize --out "$WORK/graph.h5" --force
"$HERE/mpirun/launch.sh" partition -- "$WORK/graph.h5" --parts "$RANKS" --method metis --out "$WORK/parts" --force
"$HERE/mpirun/launch.sh" train -n "$RANKS" -t 1 -- --parts "$WORK/parts" --out "$WORK/run" --force \
    --model "$MODEL" --hidden 64 --epochs "$EPOCHS" --eval-every 10 --checkpoint-every 50 --comm-timeout 120 \
    --no-progress

# shellcheck source=lib/common.sh
source "$HERE/lib/common.sh"
G3_TAG="g3-soak"
g3_setup_env
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" "$G3_PY" -m g3mpi.train.soak "$WORK/run" --warmup "$WARMUP"
