#!/usr/bin/env bash
# README command 2: install everything and run the whole test suite, serial and multi-rank.
#
#   bash jobs/test.sh [PYTEST ARGS]      (default: every test under tests/)
#
# Creates or reuses a virtual environment (G3_VENV, default .venv in the repository), installs torch==2.13.0
# first and then the package with its test extra, installs the Debian packages some tests need when it can
# (root and apt-get: slurm-wlm and munge for the SLURM tests, hdf5-tools for h5ls; otherwise those tests skip and
# say why, or fail under G3_NO_SKIP=1 as in .ci/run), and runs pytest. Multi-rank tests start `mpiexec -n N` from
# the venv (the pip MPICH).
# Exit status: pytest's, except that "no tests collected" (pytest's 5) is a failure too.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/venv.sh
source "$REPO/jobs/lib/venv.sh"

t0=$SECONDS
g3_venv_install "$REPO" test
g3_apt_install slurm-wlm munge hdf5-tools || true
echo "== setup took $((SECONDS - t0)) s"

cd "$REPO"
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# the venv's bin first: console scripts, mpiexec of the pip MPICH
export PATH=$G3_VENV/bin:$PATH
args=("$@")
((${#args[@]})) || args=(tests)
rc=0
"$G3_PY" -m pytest -ra --durations=30 "${args[@]}" || rc=$?
if ((rc == 5)); then
    echo "jobs/test.sh: error: pytest collected no tests" >&2
    exit 1
fi
echo "== jobs/test.sh: pytest exited with status $rc after $((SECONDS - t0)) s"
exit $rc
