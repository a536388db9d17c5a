#!/usr/bin/env bash
# g3-bench through mpiexec:
#   jobs/mpirun/bench.sh [-n RANKS] [-t THREADS] [-f HOSTFILE] [--ppn N] [--dry-run] [--] [g3-bench ARGS]
# (see jobs/mpirun/launch.sh)
exec "$(dirname "${BASH_SOURCE[0]}")/launch.sh" bench "$@"
