#!/usr/bin/env bash
# The device checks of issue 28 (GPU ranks) on a machine with a CUDA GPU, in one short run:
#
#   bash jobs/device/gpu-check.sh [PYTEST ARGS]      (G3_VENV and the other settings as for jobs/test.sh)
#
# Creates or reuses the virtual environment (jobs/lib/venv.sh; torch==2.13.0 as the pip index builds it, which on
# Linux from PyPI is the CUDA build), refuses to go on where torch sees no GPU (the CUDA tests would only skip),
# prints what torch and MPI see, and runs the tests of the CUDA code: the device selection with the real GPU count
# and g3-train's start-up refusal (tests/test_device.py), the halo exchange staged through pinned host buffers on a
# side stream (tests/test_staging.py), the queued sends (tests/test_comm.py) and the gradient allreduce from device
# memory (tests/test_gradsync.py). A few minutes at most.
# Exit status: pytest's; 1 without a GPU.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../lib/venv.sh
source "$REPO/jobs/lib/venv.sh"

g3_venv_install "$REPO" test
cd "$REPO"
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PATH=$G3_VENV/bin:$PATH
"$G3_PY" - <<'PY' || { echo "jobs/device/gpu-check.sh: error: torch sees no CUDA GPU here" >&2; exit 1; }
import sys

import torch
from mpi4py import MPI

from g3mpi.train.device import mpi_cuda_support

print(f"== torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none")
print(f"== MPI {MPI.Get_library_version().splitlines()[0]}; reports CUDA support: {mpi_cuda_support()}")
sys.exit(0 if torch.cuda.is_available() else 1)
PY
args=("$@")
((${#args[@]})) || args=(tests/test_device.py tests/test_staging.py tests/test_comm.py tests/test_gradsync.py)
rc=0
"$G3_PY" -m pytest -ra "${args[@]}" || rc=$?
echo "== jobs/device/gpu-check.sh: pytest exited with status $rc"
exit $rc
