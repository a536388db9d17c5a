#!/usr/bin/env bash
# g3-train through mpiexec:
#   jobs/mpirun/train.sh [-n RANKS] [-t THREADS] [-f HOSTFILE] [--ppn N] [--dry-run] [--] [g3-train ARGS]
# (see jobs/mpirun/launch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/launch.sh" train "$@"
