#!/usr/bin/env bash
# Run one g3mpi stage with mpiexec on a workstation or on the hosts of a hostfile.
#
#   jobs/mpirun/launch.sh STAGE [-n RANKS] [-t THREADS] [-f HOSTFILE] [--ppn RANKS_PER_NODE] [--dry-run] [--]
#                         [TOOL ARGS]
#
# STAGE is prepare, partition (serial: one process; with a hostfile it runs on the file's first host), train or
# bench (MPI: RANKS processes under `python -m mpi4py`, so an exception on any rank aborts them all). THREADS is
# the threads per rank (OMP_NUM_THREADS, torch's intra-op pool). TOOL ARGS go to the stage's command line
# (g3-prepare, g3-partition, g3-train, g3-bench); options left out are filled from G3_* variables (see
# jobs/lib/common.sh and docs/JOBS.md). Before starting a multi-rank stage it checks that the ranks form one
# MPI world of the requested size. The exit status is the stage's.
#
# Examples:
#   jobs/mpirun/launch.sh prepare -- npz data/cora.npz --out cora.h5
#   jobs/mpirun/launch.sh partition -- cora.h5 --parts 4 --method metis --out cora-parts
#   jobs/mpirun/launch.sh train -n 4 -t 1 -- --parts cora-parts --out runs/cora --model gcn --epochs 200
#   jobs/mpirun/launch.sh train -n 16 -t 8 -f hosts.txt --ppn 4 -- --parts /shared/parts --out /shared/run
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$HERE/../lib/common.sh"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

(($#)) || usage
STAGE=$1
shift
case $STAGE in
    prepare | partition | train | bench) ;;
    -h | --help) usage ;;
    *) echo "launch.sh: error: unknown stage '$STAGE' (prepare, partition, train, bench)" >&2; exit 2 ;;
esac
G3_TAG="g3-$STAGE launcher"

RANKS=1
HOSTFILE=""
PPN=""
while (($#)); do
    case $1 in
        -n | --ranks) RANKS=${2:?-n needs a value}; shift 2 ;;
        -t | --threads) G3_THREADS=${2:?-t needs a value}; shift 2 ;;
        -f | --hostfile) HOSTFILE=${2:?-f needs a value}; shift 2 ;;
        --ppn) PPN=${2:?--ppn needs a value}; shift 2 ;;
        --dry-run) G3_DRY_RUN=1; shift ;;
        -h | --help) usage ;;
        --) shift; break ;;
        *) break ;;
    esac
done

g3_setup_env
g3_stage "$STAGE" "$RANKS" "$HOSTFILE" "$PPN" "$@"
