#!/usr/bin/env bash
# README command 1: install, then run the main job end to end on the embedded default graph.
#
#   bash jobs/quickstart.sh
#
# 1. creates or reuses a virtual environment (G3_VENV, default .venv) and installs g3mpi (torch==2.13.0 first);
# 2. generates the default graph: a synthetic stochastic block model, 60,000 nodes in 8 classes with
#    class-correlated 64-dim features (g3-prepare sbm);
# 3. partitions it into 4 parts with METIS (g3-partition) and validates and summarises the partition (g3-inspect);
# 4. trains a GCN on 4 MPI ranks (g3-train under mpiexec), then prints test accuracy and timings.
# Everything lands in G3_QUICKSTART_DIR (default <repo>/quickstart); the graph and partition are reused when a
# previous run made them. Knobs: G3_QS_NODES (60000), G3_QS_RANKS (4), G3_QS_THREADS (threads per rank, 1),
# G3_QS_EPOCHS (100), G3_QS_METHOD (metis).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/venv.sh
source "$REPO/jobs/lib/venv.sh"

NODES=${G3_QS_NODES:-60000}
RANKS=${G3_QS_RANKS:-4}
THREADS=${G3_QS_THREADS:-1}
EPOCHS=${G3_QS_EPOCHS:-100}
METHOD=${G3_QS_METHOD:-metis}
WORK=${G3_QUICKSTART_DIR:-$REPO/quickstart}

t_all=$SECONDS
g3_venv_install "$REPO" ""
export PATH=$G3_VENV/bin:$PATH
export G3_PYTHON=$G3_PY
mkdir -p "$WORK"
cd "$WORK"
echo "== working directory $WORK"

importable() { "$G3_PY" -c "import $1" >/dev/null 2>&1; }
for m in data_tools.prepare data_tools.partition data_tools.inspection g3mpi.cli.train; do
    importable "$m" || {
        echo "quickstart: error: $m is not available in this checkout (python -c 'import $m' fails)" >&2
        exit 1
    }
done

declare -A took
stage() {  # stage NAME CMD...: run one step, time it, stop on failure
    local name=$1 t0=$SECONDS
    shift
    echo
    echo "== $name: $*"
    "$@" || { echo "quickstart: error: $name failed (status $?)" >&2; exit 1; }
    took[$name]=$((SECONDS - t0))
}

if [[ -f graph.h5 ]] && "$G3_PY" -m data_tools.inspection graph.h5 >/dev/null 2>&1; then
    echo "== reusing $WORK/graph.h5 (delete it to regenerate)"
else
    rm -f graph.h5
    stage prepare bash "$REPO/jobs/mpirun/prepare.sh" -t "$THREADS" -- \
        sbm --nodes "$NODES" --classes 8 --feature-dim 64 --seed 0 --out graph.h5
fi
if [[ -f parts/meta.json ]] && [[ parts/meta.json -nt graph.h5 ]] &&
    "$G3_PY" -m data_tools.inspection parts >/dev/null 2>&1 &&
    [[ $("$G3_PY" -c 'import json; print(json.load(open("parts/meta.json"))["num_parts"])') == "$RANKS" ]]; then
    echo "== reusing $WORK/parts (delete it to repartition)"
else
    rm -rf parts
    stage partition bash "$REPO/jobs/mpirun/partition.sh" -t "$THREADS" -- \
        graph.h5 --parts "$RANKS" --method "$METHOD" --out parts
fi
stage inspect "$G3_PY" -m data_tools.inspection parts

RUN=run-$(date +%Y%m%d-%H%M%S)
stage train bash "$REPO/jobs/mpirun/train.sh" -n "$RANKS" -t "$THREADS" -- \
    --parts parts --out "$RUN" --model gcn --epochs "$EPOCHS"

echo
echo "== results ($WORK/$RUN/summary.json)"
"$G3_PY" - "$RUN/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
def show(prefix, d):
    for k, v in d.items():
        if isinstance(v, dict):
            show(f"{prefix}{k}.", v)
        elif (k.endswith("acc") or "time" in k or "seconds" in k or k.endswith("_s")
              or k in ("epochs", "world_size", "model")):
            print(f"   {prefix}{k}: {v:.4f}" if isinstance(v, float) else f"   {prefix}{k}: {v}")
show("", s)
EOF
echo "   plots: $WORK/$RUN/training.png, $WORK/$RUN/ranks.png"
echo
echo "== timings (wall seconds)"
for name in prepare partition inspect train; do
    [[ -n ${took[$name]:-} ]] && echo "   $name: ${took[$name]}"
done
echo "   total (with install): $((SECONDS - t_all))"
echo
echo "== next: put g3-prepare, g3-partition, g3-train and mpiexec on PATH in your shell (README, A Cora example):"
echo "   source $(printf '%q' "$G3_VENV")/bin/activate"
