#!/usr/bin/env bash
# Run some tests N times in a row with B busy loops beside them (a loaded machine), stopping at the first failure.
#
#   G3_VENV=.venv bash tests/under_load.sh N B PYTEST ARGS...
#   e.g. bash tests/under_load.sh 20 2 tests/test_train_cli.py -k "config_that_cannot_be_read or bad_command_line"
#
# The venv (G3_VENV, default .venv) is the one jobs/test.sh installed; pytest runs as there. Prints
# "passed K of N runs" and exits 0 only if all N passed. The busy loops are this script's children, killed when
# it ends.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n=$1 busy=$2
shift 2
py=${G3_VENV:-$REPO/.venv}/bin/python
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PATH=$(dirname "$py"):$PATH
cd "$REPO" || exit 1
loops=()
stop_loops() { ((${#loops[@]})) && kill "${loops[@]}" 2>/dev/null; wait 2>/dev/null; }
trap stop_loops EXIT
trap 'exit 143' TERM INT
for ((i = 0; i < busy; i++)); do
    (while :; do :; done) &
    loops+=($!)
done
passed=0
for ((i = 1; i <= n; i++)); do
    if "$py" -m pytest -q -p no:cacheprovider "$@" >"${TMPDIR:-/tmp}/under_load.$$.log" 2>&1; then
        passed=$((passed + 1))
        echo "run $i: passed ($(uptime | sed 's/.*load average: //'))"
    else
        echo "run $i: FAILED; its output:"
        cat "${TMPDIR:-/tmp}/under_load.$$.log"
        break
    fi
done
rm -f "${TMPDIR:-/tmp}/under_load.$$.log"
echo "passed $passed of $n runs with $busy busy loops beside"
((passed == n))
