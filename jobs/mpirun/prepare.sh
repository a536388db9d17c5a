#!/usr/bin/env bash
# g3-prepare through mpiexec:
#   jobs/mpirun/prepare.sh [-n RANKS] [-t THREADS] [-f HOSTFILE] [--ppn N] [--dry-run] [--] [g3-prepare ARGS]
# (see jobs/mpirun/launch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/launch.sh" prepare "$@"
