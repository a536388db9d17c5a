#!/usr/bin/env bash
# g3-partition through mpiexec:
#   jobs/mpirun/partition.sh [-n RANKS] [-t THREADS] [-f HOSTFILE] [--ppn N] [--dry-run] [--] [g3-partition ARGS]
# (see jobs/mpirun/launch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/launch.sh" partition "$@"
