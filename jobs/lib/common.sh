# shellcheck shell=bash
# Shared by the mpirun launchers (jobs/mpirun/*.sh) and the SLURM batch scripts (jobs/slurm/*.sbatch).
# Source it; it defines functions only (no side effects at source time).
#
# What it knows: how to find Python and the MPI launcher, how many threads a rank gets, how to start N ranks
# (srun inside a SLURM allocation, mpiexec otherwise), how to prove that N ranks really form one MPI world,
# and how to turn G3_* environment variables into a stage's command line. It knows the command lines of the
# g3mpi tools and nothing of their internals.
#
# Environment read here (all optional):
#   G3_SETUP        a shell file sourced first (site setup: module loads, spack env, conda activate, ...)
#   G3_MODULES      modules to `module load` (e.g. "gcc/12 openmpi/4.1"); needs environment modules or Lmod
#   G3_VENV         a virtual environment whose bin/python runs the tools
#   G3_PYTHON       the Python to use (default: $G3_VENV/bin/python, else python3 on PATH)
#   G3_THREADS      threads per rank (default: SLURM_CPUS_PER_TASK inside SLURM, else 1); exported as
#                   OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS, which torch's intra-op pool follows
#   G3_LAUNCHER     srun or mpiexec (default: srun inside a SLURM allocation, mpiexec outside)
#   G3_SRUN_MPI     srun's --mpi plugin (default pmi2, what the pip MPICH speaks; pmix for Open MPI / PMIx builds)
#   G3_SRUN_ARGS    extra srun arguments (word-split)
#   G3_MPIEXEC      the mpiexec to use (default: the one beside $G3_PYTHON, i.e. the pip MPICH's, else on PATH)
#   G3_MPIEXEC_ARGS extra mpiexec arguments (word-split), e.g. "--allow-run-as-root" for Open MPI as root
#   G3_CHECK_WORLD  1 (default): before a multi-rank stage, start the same N ranks once and check that they form
#                   one world of size N (catches srun --mpi=none, or an mpiexec of another MPI than mpi4py's)
#   G3_DRY_RUN      1: print the command a stage would run instead of running it
# On/off variables (G3_CHECK_WORLD, G3_DRY_RUN, G3_FORCE) take 1/0, true/false, yes/no or on/off (any case);
# anything else is an error naming the variable.
#   G3_TIMEOUT      a time limit for the stage's command (timeout(1) syntax, e.g. 90m); SLURM jobs have --time.
#                   g3-train stops with a checkpoint (SIGTERM; SIGUSR1 through srun); status 124
#   G3_STOP_MARGIN  train.sbatch and sweep.sbatch: g3-train stops (checkpoint, then requeue) this many seconds
#                   before the job's end (--time-limit from the time left; default 120, as --signal=B:USR1@120;
#                   0: only on the signal). g3_train_job below
#   G3_REQUEUE      1 (default): a train job stopped by its time limit requeues itself and resumes; 0: it exits 75
#   G3_STALL_REQUEUES  how many times a train job that a stalled rank ended (status 69, its last checkpoint
#                   valid) requeues itself and resumes (default 2; 0: it exits 69)
#   G3_KILL_AFTER   with G3_TIMEOUT: how long the stopped command may take to finish its epoch, write its
#                   checkpoint and exit before SIGKILL (timeout(1) syntax; default 60s). Raise it when one epoch
#                   takes longer than that: a kill before the checkpoint loses every epoch since the last one.

G3_TAG=${G3_TAG:-g3-jobs}

g3_log() { echo "$G3_TAG: $*" >&2; }
g3_die() { echo "$G3_TAG: error: $*" >&2; exit 1; }

g3_in_slurm() { [[ -n ${SLURM_JOB_ID:-} ]]; }

# g3_opt_form ARG OPT: how ARG gives the option OPT, as argparse reads it: "next" (the value is the next
# argument: "--out V", or an abbreviation "--ou V"), "attached" ("--out=V", "--ou=V", "-oV") or status 1 (not OPT)
g3_opt_form() {
    local a=$1 o=$2 name=${1%%=*}
    if [[ $o == --* ]]; then
        # argparse takes any unambiguous prefix of a long option ("--par 8" is --parts 8)
        [[ $name == --?* && $o == "$name"* ]] || return 1
        [[ $a == *=* ]] && echo attached || echo next
    else
        [[ $a == "$o"* ]] || return 1
        [[ $a == "$o" ]] && echo next || echo attached
    fi
}

# g3_has_opt OPTS ARGS...: ARGS contain one of OPTS ("--out|-o") in any form argparse accepts (g3_opt_form)
g3_has_opt() {
    local opts a o
    IFS='|' read -r -a opts <<<"$1"
    shift
    for a in "$@"; do
        for o in "${opts[@]}"; do
            g3_opt_form "$a" "$o" >/dev/null && return 0
        done
    done
    return 1
}

# g3_opt_value OPTS ARGS...: print the value of the option OPTS ("--parts|-p") in ARGS (last one wins);
# status 1 if absent
g3_opt_value() {
    local opts o form found=1 val=""
    IFS='|' read -r -a opts <<<"$1"
    shift
    while (($#)); do
        for o in "${opts[@]}"; do
            form=$(g3_opt_form "$1" "$o") || continue
            if [[ $form == next && $# -ge 2 ]]; then
                val=$2
                found=0
                shift
            elif [[ $form == attached ]]; then
                if [[ $1 == --* ]]; then val=${1#*=}; else val=${1#"$o"}; fi
                found=0
            fi
            break
        done
        shift
    done
    ((found == 0)) && printf '%s\n' "$val"
    return $found
}

# g3_flag NAME DEFAULT: status 0 if the on/off variable NAME is on, 1 if off; unset or empty means DEFAULT.
# 1/true/yes/on and 0/false/no/off (any case); anything else dies naming the variable (a typo such as
# G3_DRY_RUN=ye must not run the job for real)
g3_flag() {
    local v=${!1:-$2}
    case ${v,,} in
        1 | true | yes | on) return 0 ;;
        0 | false | no | off) return 1 ;;
        *) g3_die "$1 must be 1 or 0 (or true/false, yes/no, on/off), got '$v'" ;;
    esac
}

# g3_quote ARGS...: the arguments as one shell-quoted line (for logs that can be pasted back into a shell)
g3_quote() {
    local s
    s=$(printf '%q ' "$@")
    printf '%s' "${s% }"
}

# g3_check_settings: the G3_* settings that are not paths, checked before anything runs
g3_check_settings() {
    g3_flag G3_DRY_RUN 0 || true
    g3_flag G3_CHECK_WORLD 1 || true
    g3_flag G3_FORCE 0 || true
    if [[ -n ${G3_LAUNCHER:-} && $G3_LAUNCHER != srun && $G3_LAUNCHER != mpiexec ]]; then
        g3_die "G3_LAUNCHER must be srun or mpiexec, got '$G3_LAUNCHER'"
    fi
    # timeout(1)'s syntax: a number (decimals allowed) with an optional unit s, m, h or d
    local v
    for v in G3_TIMEOUT G3_KILL_AFTER; do
        if [[ -n ${!v:-} ]] && ! [[ ${!v} =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)[smhd]?$ ]]; then
            g3_die "$v must be a duration for timeout(1) (a number with an optional unit s, m, h or d, e.g. 90m)," \
                "got '${!v}'"
        fi
    done
}

# g3_positive NAME VALUE: VALUE is a positive integer, or die naming NAME
g3_positive() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] || g3_die "$1 must be a positive integer, got '$2'"
}

# g3_setup_env: site setup, modules, Python, threads. Sets G3_PY and G3_THREADS.
g3_setup_env() {
    # site scripts (Lmod, conda activate, spack) often read unset variables: no `set -u` while they run
    local had_u=0
    [[ $- == *u* ]] && had_u=1
    set +u
    if [[ -n ${G3_SETUP:-} ]]; then
        [[ -r $G3_SETUP ]] || g3_die "G3_SETUP=$G3_SETUP: no such readable file"
        # shellcheck disable=SC1090
        source "$G3_SETUP"
    fi
    if [[ -n ${G3_MODULES:-} ]]; then
        type module >/dev/null 2>&1 || g3_die "G3_MODULES is set but the 'module' command is not available"
        # shellcheck disable=SC2086
        module load $G3_MODULES || g3_die "module load $G3_MODULES failed"
    fi
    ((had_u)) && set -u
    if [[ -n ${G3_PYTHON:-} ]]; then
        G3_PY=$G3_PYTHON
    elif [[ -n ${G3_VENV:-} ]]; then
        G3_PY=$G3_VENV/bin/python
    else
        G3_PY=$(command -v python3 || true)
    fi
    if [[ -z $G3_PY ]] || ! command -v "$G3_PY" >/dev/null 2>&1; then
        g3_die "no Python found at '${G3_PY:-python3}' (set G3_PYTHON or G3_VENV, or put the environment with g3mpi" \
            "on PATH)"
    fi
    G3_THREADS=${G3_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    g3_positive G3_THREADS "$G3_THREADS"
    g3_check_settings
    export OMP_NUM_THREADS=$G3_THREADS MKL_NUM_THREADS=$G3_THREADS OPENBLAS_NUM_THREADS=$G3_THREADS
}

g3_launcher() {
    if [[ -n ${G3_LAUNCHER:-} ]]; then
        [[ $G3_LAUNCHER == srun || $G3_LAUNCHER == mpiexec ]] ||
            g3_die "G3_LAUNCHER must be srun or mpiexec, got '$G3_LAUNCHER'"
        echo "$G3_LAUNCHER"
    elif g3_in_slurm; then
        echo srun
    else
        echo mpiexec
    fi
}

g3_mpiexec() {
    if [[ -n ${G3_MPIEXEC:-} ]]; then
        echo "$G3_MPIEXEC"
    elif [[ -x $(dirname "$(command -v "$G3_PY")")/mpiexec ]]; then
        echo "$(dirname "$(command -v "$G3_PY")")/mpiexec"
    else
        command -v mpiexec || g3_die "no mpiexec found (set G3_MPIEXEC)"
    fi
}

# g3_srun_netmod: under srun, an MPICH built with both the UCX and the OFI netmod (the pip wheel) runs OFI.
# Slurm's pmi2 plugin reads a PMI-1 request with a single read of 1024 bytes; MPICH splits its address
# exchange into values of up to 1024 characters, so a put line can exceed that and is cut, and the ranks
# abort at start-up (UCX "addr version" assertion) whenever UCX's long addresses encode too long. OFI's
# addresses are 16-byte sockaddrs: one short line per node. A netmod the user chose is kept.
g3_srun_netmod() {
    [[ -z ${MPIR_CVAR_CH4_NETMOD:-} ]] || return 0
    g3_flag G3_DRY_RUN 0 && return 0
    local device
    device=$("$G3_PY" -c 'import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
lines = MPI.Get_library_version().splitlines()
print(next((l.split(":", 1)[1] for l in lines if l.startswith("MPICH Device:")), ""))' 2>/dev/null) || return 0
    if [[ $device == *ucx* && $device == *ofi* ]]; then
        export MPIR_CVAR_CH4_NETMOD=ofi
        g3_log "srun: MPICH netmod ofi (MPIR_CVAR_CH4_NETMOD; UCX addresses overflow Slurm's PMI-1 line)"
    fi
}

# g3_mpi_command N [HOSTFILE [PPN]]: set the array G3_LAUNCH to the launcher prefix that starts N ranks
g3_mpi_command() {
    local n=$1 hostfile=${2:-} ppn=${3:-} exe flavour launcher
    launcher=$(g3_launcher) || exit 1
    G3_LAUNCH=()
    if [[ $launcher == srun ]]; then
        g3_in_slurm || g3_die "G3_LAUNCHER=srun outside a SLURM allocation"
        [[ -z $hostfile ]] || g3_die "a hostfile makes no sense inside SLURM: the allocation decides the hosts"
        # the job's CPUs per task when it declared them, not G3_THREADS: a step cannot ask for more than the
        # allocation holds, and G3_THREADS overrides only the thread count (more threads than CPUs share cores);
        # a job without --cpus-per-task (e.g. --exclusive nodes) asks for G3_THREADS
        G3_LAUNCH=(srun --mpi="${G3_SRUN_MPI:-pmi2}" --kill-on-bad-exit=1 --ntasks="$n"
            --cpus-per-task="${SLURM_CPUS_PER_TASK:-${G3_THREADS:-1}}")
        [[ -z $ppn ]] || G3_LAUNCH+=(--ntasks-per-node="$ppn")
        # shellcheck disable=SC2206
        [[ -z ${G3_SRUN_ARGS:-} ]] || G3_LAUNCH+=($G3_SRUN_ARGS)
        g3_srun_netmod
        return 0
    fi
    exe=$(g3_mpiexec) || exit 1
    case $("$exe" --version 2>&1) in
        *HYDRA* | *Hydra* | *hydra*) flavour=hydra ;;
        *"Open MPI"* | *OpenRTE* | *PRRTE* | *prte*) flavour=openmpi ;;
        *) flavour=generic ;;
    esac
    G3_LAUNCH=("$exe" -n "$n")
    if [[ -n $hostfile ]]; then
        [[ -r $hostfile ]] || g3_die "hostfile $hostfile: no such readable file"
        case $flavour in
            hydra) G3_LAUNCH+=(-f "$hostfile") ;;
            *) G3_LAUNCH+=(--hostfile "$hostfile") ;;
        esac
    fi
    if [[ -n $ppn ]]; then
        case $flavour in
            hydra) G3_LAUNCH+=(-ppn "$ppn") ;;
            openmpi) G3_LAUNCH+=(--map-by "ppr:$ppn:node") ;;
            *) g3_die "ranks per node: unknown mpiexec flavour of $exe; pass its option in G3_MPIEXEC_ARGS" ;;
        esac
    fi
    # environment for every rank: hydra and Open MPI forward the caller's environment by default
    # shellcheck disable=SC2206
    [[ -z ${G3_MPIEXEC_ARGS:-} ]] || G3_LAUNCH+=($G3_MPIEXEC_ARGS)
    return 0
}

# g3_check_world N [HOSTFILE [PPN]]: start N ranks of a tiny mpi4py program the same way the stage will and check
# that they form one world: N answers, each of size N, ranks 0..N-1. A launcher that does not wire the ranks
# together (srun --mpi=none with MPICH, an mpiexec from a different MPI than mpi4py's) starts N singletons,
# each believing it is rank 0 of 1; training would then run N independent copies. Fail loudly instead.
g3_check_world() {
    local n=$1 hostfile=${2:-} ppn=${3:-} out rc=0
    g3_flag G3_CHECK_WORLD 1 || return 0
    g3_flag G3_DRY_RUN 0 && return 0
    g3_mpi_command "$n" "$hostfile" "$ppn"
    local launch=("${G3_LAUNCH[@]}")
    # rank 0 of each world reports every member of its world in one write (lines from different processes
    # written piecewise would interleave): one world of N gives N lines of size N, N singletons N lines of size 1.
    # Each names its node: SLURM's node name under srun (several slurmd may share a host), else the host's.
    local probe='import os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
node = os.environ.get("SLURMD_NODENAME") or MPI.Get_processor_name()
me = " ".join(["g3-probe", str(c.rank), str(c.size), node, os.environ.get("OMP_NUM_THREADS", "-")])
everyone = c.gather(me, root=0)
if c.rank == 0:
    sys.stdout.write("".join(line + "\n" for line in everyone))
    sys.stdout.flush()'
    out=$(timeout "${G3_PROBE_TIMEOUT:-300}" "${launch[@]}" "$G3_PY" -m mpi4py -c "$probe" 2>&1) || rc=$?
    if ((rc != 0)); then
        printf '%s\n' "$out" >&2
        g3_die "the MPI world check ($(g3_quote "${launch[@]}" "$G3_PY") -m mpi4py -c ...) failed with status $rc"
    fi
    local verdict
    verdict=$(printf '%s\n' "$out" | awk -v n="$n" '
        $1 == "g3-probe" { lines++; if ($3 != n) bad++; seen[$2]++; size = $3 }
        END {
            dup = 0; for (r = 0; r < n; r++) if (seen[r] != 1) dup++
            note = ""
            if (lines > 0 && size == 1 && n > 1)
                note = " (singletons: the launcher did not wire the ranks into one MPI world)"
            if (lines == n && bad == 0 && dup == 0) print "ok"
            else printf "expected %d ranks of one world of size %d, got %d processes reporting world size %s%s\n",
                        n, n, lines, (lines ? size : "?"), note
        }')
    if [[ $verdict != ok ]]; then
        printf '%s\n' "$out" >&2
        g3_die "MPI world size mismatch: $verdict. Under SLURM use srun --mpi=pmi2 for the pip MPICH" \
            "(G3_SRUN_MPI; 'srun --mpi=list' shows the plugins) or G3_LAUNCHER=mpiexec; with mpiexec, use the one" \
            "of the MPI that mpi4py was built against (G3_MPIEXEC)"
    fi
    local per_node
    per_node=$(printf '%s\n' "$out" |
        awk '$1 == "g3-probe" { h[$4]++ } END { for (k in h) printf "%s%s:%d", (c++ ? " " : ""), k, h[k] }')
    g3_log "MPI world check passed: $n ranks, one world of size $n ($per_node)"
}

# g3_check_module MODULE: the stage's module is importable by $G3_PY (before any rank starts)
g3_check_module() {
    g3_flag G3_DRY_RUN 0 && return 0
    "$G3_PY" -c 'import importlib.util, sys
try:
    ok = importlib.util.find_spec(sys.argv[1]) is not None
except ImportError:
    ok = False
sys.exit(0 if ok else 1)' "$1" ||
        g3_die "$1 is not importable by $G3_PY: install g3mpi in that environment (pip install -e .) or choose" \
            "another with G3_VENV / G3_PYTHON"
}

# g3_check_train_start RANKS ARGS...: g3-train's own checks of a job of RANKS ranks that read no part's data
# (g3-train --check RANKS: the settings, one part file per rank, a run directory that can be made, the model file),
# before anything is launched (in a dry run too). In a dry run, a partition directory that is not there yet (an
# earlier stage of the same pipeline writes it) is only mentioned.
g3_check_train_start() {
    local n=$1 parts out
    shift
    parts=$(g3_opt_value --parts "$@") || parts=
    if g3_flag G3_DRY_RUN 0 && [[ -n $parts && ! -e $parts ]]; then
        g3_log "dry run: $parts is not there yet: the run is not checked against $n rank(s)"
        return 0
    fi
    if ! out=$("$G3_PY" -m g3mpi.cli.train --check "$n" "$@" 2>&1 >/dev/null); then
        g3_die "${out#g3-train: error: }"
    fi
}

# g3_seconds DURATION: a timeout(1) duration (a number with an optional unit s, m, h or d) in seconds
g3_seconds() {
    awk -v d="$1" 'BEGIN { u = substr(d, length(d)); n = d; f = 1
        if (u == "s" || u == "m" || u == "h" || u == "d") {
            n = substr(d, 1, length(d) - 1); f = (u == "m") ? 60 : (u == "h") ? 3600 : (u == "d") ? 86400 : 1
        }
        printf "%g\n", n * f }'
}

# g3_run CMD...: run (or print, with G3_DRY_RUN=1) a command, report and return its exit status.
# G3_TIMEOUT (a duration for timeout(1), e.g. 90m) bounds it: a stop signal, then SIGKILL G3_KILL_AFTER (default
# 60s) later; status 124. The stop signal is SIGTERM, except for srun: srun takes SIGTERM as "abort the step" and
# SIGKILLs the tasks (no checkpoint), but forwards SIGUSR1 to them, which g3-train handles like SIGTERM
# (checkpoint, status 75).
g3_run() {
    local rc=0 sig=TERM
    if [[ -n ${G3_TIMEOUT:-} ]]; then
        [[ $(basename -- "$1") == srun ]] && sig=USR1
        set -- timeout --signal="$sig" --kill-after="${G3_KILL_AFTER:-60s}" "$G3_TIMEOUT" "$@"
    fi
    g3_log "running: $(g3_quote "$@")"
    if g3_flag G3_DRY_RUN 0; then
        printf '%q ' "$@"
        printf '\n'
        return 0
    fi
    local t0=$SECONDS
    if ((${G3_FORWARD_SIGNALS:-0})); then
        # in the background, so that the batch shell's traps (g3_stop_traps) run while it works
        "$@" &
        G3_CHILD=$!
        g3_wait_child || rc=$?
        G3_CHILD=
    else
        "$@" || rc=$?
    fi
    if ((rc == 0)); then
        g3_log "done in $((SECONDS - t0)) s"
    else
        g3_log "error: exited with status $rc after $((SECONDS - t0)) s: $(g3_quote "$@")"
    fi
    return $rc
}

# ---- stages: default arguments from the environment -------------------------------------------------------
# Each g3_args_STAGE sets the array G3_ARGS to the tool's arguments: the caller's ARGS, plus defaults from G3_*
# variables for the options the caller did not give. Relative paths are relative to the job's working directory.

# prepare: g3-prepare KIND ... --out $G3_GRAPH; with no arguments the embedded default graph (the quickstart's SBM)
G3_DEFAULT_PREPARE="sbm --nodes 60000 --classes 8 --feature-dim 64 --seed 0"
g3_args_prepare() {
    local args=("$@")
    if ((${#args[@]} == 0)); then
        # shellcheck disable=SC2206
        args=(${G3_PREPARE_ARGS:-$G3_DEFAULT_PREPARE})
    fi
    g3_has_opt "--out|-o" "${args[@]}" || args+=(--out "${G3_GRAPH:-graph.h5}")
    if g3_flag G3_FORCE 0 && ! g3_has_opt --force "${args[@]}"; then
        args+=(--force)
    fi
    G3_ARGS=("${args[@]}")
}

# partition: g3-partition $G3_GRAPH --parts $G3_NUM_PARTS --method $G3_METHOD --out $G3_PARTS ARGS
g3_args_partition() {
    local args=("$@")
    if ((${#args[@]} == 0)) && [[ -n ${G3_PARTITION_ARGS:-} ]]; then
        # shellcheck disable=SC2206
        args=($G3_PARTITION_ARGS)
    fi
    local first=${args[0]:-}
    if [[ -z $first || $first == -* ]]; then
        args=("${G3_GRAPH:-graph.h5}" "${args[@]}")
    fi
    g3_has_opt "--parts|-p" "${args[@]}" || args+=(--parts "${G3_NUM_PARTS:-4}")
    g3_has_opt --method "${args[@]}" || args+=(--method "${G3_METHOD:-metis}")
    g3_has_opt "--out|-o" "${args[@]}" || args+=(--out "${G3_PARTS:-parts}")
    if g3_flag G3_FORCE 0 && ! g3_has_opt --force "${args[@]}"; then
        args+=(--force)
    fi
    G3_ARGS=("${args[@]}")
}

# train: g3-train --parts $G3_PARTS --out $G3_OUT [--config $G3_CONFIG] --threads $G3_THREADS
#        [--time-limit <G3_TIMEOUT in seconds>] $G3_TRAIN_ARGS ARGS;
# with --resume RUN in the arguments: g3-train --parts <RUN's partition> --threads $G3_THREADS ... --resume RUN
g3_args_train() {
    local args=() run parts
    # shellcheck disable=SC2206
    [[ -z ${G3_TRAIN_ARGS:-} ]] || args=($G3_TRAIN_ARGS)
    args+=("$@")
    if run=$(g3_opt_value --resume "${args[@]}"); then
        # --resume RUN: g3-train continues in RUN with RUN/config.toml's settings, so no --out or --config of
        # ours; the partition is the run's own (given here too, for the check of ranks against parts)
        [[ -f $run/config.toml ]] ||
            g3_die "$run/config.toml: no such file (--resume needs the run directory of an earlier g3-train)"
        if ! g3_has_opt --parts "${args[@]}"; then
            parts=$("$G3_PY" -c 'import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["parts"])' "$run/config.toml") ||
                g3_die "$run/config.toml: cannot read its partition directory ('parts')"
            args=(--parts "$parts" "${args[@]}")
        fi
    else
        g3_has_opt --parts "${args[@]}" || args=(--parts "${G3_PARTS:-parts}" "${args[@]}")
        g3_has_opt --out "${args[@]}" || args+=(--out "${G3_OUT:-$(g3_default_run_dir train)}")
        if [[ -n ${G3_CONFIG:-} ]] && ! g3_has_opt --config "${args[@]}"; then
            args+=(--config "$G3_CONFIG")
        fi
    fi
    # torch threads per rank, explicitly (OMP_NUM_THREADS is exported too)
    g3_has_opt --threads "${args[@]}" || args+=(--threads "$G3_THREADS")
    # G3_TIMEOUT also as g3-train's own time limit: timeout(1)'s stop signal, sent to srun before the tasks run
    # (a slow start), is dropped by srun; the time limit is not
    if [[ -n ${G3_TIMEOUT:-} ]] && ! g3_has_opt --time-limit "${args[@]}"; then
        args+=(--time-limit "$(g3_seconds "$G3_TIMEOUT")")
    fi
    G3_ARGS=("${args[@]}")
}

# bench: g3-bench $G3_SUITE --out $G3_OUT $G3_BENCH_ARGS ARGS
g3_args_bench() {
    local args=()
    # shellcheck disable=SC2206
    [[ -z ${G3_BENCH_ARGS:-} ]] || args=($G3_BENCH_ARGS)
    args+=("$@")
    local first=${args[0]:-}
    if [[ -z $first || $first == -* ]]; then
        args=("${G3_SUITE:-vs-pyg}" "${args[@]}")
    fi
    g3_has_opt --out "${args[@]}" || args+=(--out "${G3_OUT:-$(g3_default_run_dir bench)}")
    G3_ARGS=("${args[@]}")
}

g3_default_run_dir() {
    if g3_in_slurm; then
        echo "runs/$1-${SLURM_JOB_ID}"
    else
        echo "runs/$1-$(date +%Y%m%d-%H%M%S)"
    fi
}

# the module behind each stage's console script (setup.py)
g3_module() {
    case $1 in
        prepare) echo data_tools.prepare ;;
        partition) echo data_tools.partition ;;
        train) echo g3mpi.cli.train ;;
        bench) echo g3mpi.bench.cli ;;
        *) g3_die "unknown stage '$1' (prepare, partition, train, bench)" ;;
    esac
}

# serial stages run as one process; train and bench are MPI programs
g3_is_mpi_stage() { [[ $1 == train || $1 == bench ]]; }

# g3_stage STAGE RANKS HOSTFILE PPN ARGS...: the whole launch of one stage
g3_stage() {
    local stage=$1 n=$2 hostfile=$3 ppn=$4 module
    shift 4
    module=$(g3_module "$stage") || exit 1
    g3_positive ranks "$n"
    [[ -z $ppn ]] || g3_positive "ranks per node" "$ppn"
    [[ -z $hostfile || -r $hostfile ]] || g3_die "hostfile $hostfile: no such readable file"
    "g3_args_$stage" "$@"
    local tool_args=("${G3_ARGS[@]}") launch=() method
    if [[ $stage == partition ]] && ((n > 1)); then
        # the stream method is the one partitioner that runs on several ranks (each reads a slice of the graph)
        method=$(g3_opt_value --method "${tool_args[@]}")
        [[ $method == stream ]] || g3_die "g3-partition --method $method is a serial program: run it with 1 task," \
            "not $n (--method stream runs on several)"
    elif ! g3_is_mpi_stage "$stage"; then
        ((n == 1)) || g3_die "g3-$stage is a serial program: run it with 1 task, not $n"
        g3_check_module "$module"
        g3_log "$stage on $(hostname -s), $G3_THREADS thread(s)"
        if [[ -n $hostfile ]]; then
            # place the one process on the hostfile's first host
            g3_mpi_command 1 "$hostfile" ""
            launch=("${G3_LAUNCH[@]}")
        fi
        g3_run "${launch[@]}" "$G3_PY" -m "$module" "${tool_args[@]}"
        return
    fi
    [[ $stage != train ]] || g3_check_train_start "$n" "${tool_args[@]}"
    g3_check_module "$module"
    local launcher
    launcher=$(g3_launcher) || exit 1
    g3_log "$stage: $n rank(s) x $G3_THREADS thread(s), launcher $launcher"
    if [[ $launcher == srun && -n ${SLURM_CPUS_PER_TASK:-} ]] && ((G3_THREADS > SLURM_CPUS_PER_TASK)); then
        g3_log "warning: G3_THREADS=$G3_THREADS threads per rank on ${SLURM_CPUS_PER_TASK:-1} CPU(s) per task" \
            "(--cpus-per-task): the threads share cores"
    fi
    g3_check_world "$n" "$hostfile" "$ppn"
    g3_mpi_command "$n" "$hostfile" "$ppn"
    launch=("${G3_LAUNCH[@]}")
    # python -m mpi4py: an uncaught exception on any rank calls MPI_Abort, so no rank is left waiting
    g3_run "${launch[@]}" "$G3_PY" -m mpi4py -m "$module" "${tool_args[@]}"
}

# ---- time limits: stop with a checkpoint, requeue, resume (train.sbatch, sweep.sbatch) --------------------

# g3_stop_traps: the batch shell takes SIGUSR1 (sbatch --signal=B:USR1@T, the time-limit warning, or
# `scancel --batch --signal=USR1 JOB`) as "stop and requeue" and forwards it to the running step's launcher (srun
# forwards it to every task; mpiexec to every rank), and SIGTERM (scancel, the end of the job) as "cancelled":
# never requeued. g3_run then runs its command in the background so that the traps run while it works.
g3_stop_traps() {
    G3_WARNED=0 G3_CANCELLED=0 G3_TRAPPED=0 G3_CHILD= G3_FORWARD_SIGNALS=1
    trap 'G3_TRAPPED=1; G3_WARNED=1; g3_log "SIGUSR1 (time-limit warning): stopping after the current epoch"
          [[ -z $G3_CHILD ]] || kill -USR1 "$G3_CHILD" 2>/dev/null || true' USR1
    trap 'G3_TRAPPED=1; G3_CANCELLED=1
          g3_log "SIGTERM (scancel or the job'"'"'s end): the job will not be requeued"' TERM
}

# g3_wait_child: wait for G3_CHILD through the trapped signals (each interrupts `wait`); its exit status
g3_wait_child() {
    local rc again
    while :; do
        G3_TRAPPED=0
        rc=0
        wait "$G3_CHILD" || rc=$?
        ((G3_TRAPPED)) || return "$rc"
        kill -0 "$G3_CHILD" 2>/dev/null && continue
        # it ended as the trap came: its status, unless this wait already collected it (127: nothing to wait for)
        again=0
        wait "$G3_CHILD" || again=$?
        ((again == 127)) && return "$rc"
        return "$again"
    done
}

# g3_seconds_left: seconds until the job's end (squeue's time left: M:SS, H:MM:SS or D-HH:MM:SS); status 1 when
# the job has no time limit, 2 when squeue cannot say (asked twice: slurmctld may be busy)
g3_seconds_left() {
    local left q
    # (the first element of an array has the array's job ID, which names every element: pick this job's line)
    q=(squeue -h -j "${SLURM_JOB_ID:?}" -o "%A %L")
    left=$("${q[@]}" 2>/dev/null) || { sleep 2; left=$("${q[@]}"); } || return 2
    left=$(awk -v id="$SLURM_JOB_ID" '$1 == id { print $2 }' <<<"$left")
    [[ $left != UNLIMITED && $left != NOT_SET ]] || return 1
    awk -v t="$left" 'BEGIN { d = 0
        if (t ~ /^[0-9]+-/) { d = substr(t, 1, index(t, "-") - 1); t = substr(t, index(t, "-") + 1) }
        if (t !~ /^[0-9]+(:[0-9]+)*$/) exit 2
        n = split(t, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]
        print d * 86400 + s }'
}

# g3_run_dir_of ARGS...: the run directory of g3-train with these arguments (as g3_args_train completes them)
g3_run_dir_of() {
    g3_args_train "$@"
    g3_opt_value --resume "${G3_ARGS[@]}" || g3_opt_value --out "${G3_ARGS[@]}"
}

# g3_requeue_stalled RUN: after g3-train exited 69 (a rank stopped answering; RUN's last checkpoint is valid),
# requeue the job (its restart resumes RUN) unless it has been restarted G3_STALL_REQUEUES times (default 2)
# already, or RUN has no checkpoint; the status: 0 requeued, else 69.
g3_requeue_stalled() {
    local run=$1 most=${G3_STALL_REQUEUES:-2} me=${SLURM_JOB_ID:-}
    [[ $most =~ ^[0-9]+$ ]] || g3_die "G3_STALL_REQUEUES must be a whole number, got '$most'"
    if [[ -z $me ]] || ((${SLURM_RESTART_COUNT:-0} >= most)) || [[ ! -f $run/checkpoint.pt ]]; then
        g3_log "a rank stopped answering (status 69): not requeued (restart ${SLURM_RESTART_COUNT:-0} of at most" \
            "$most, or no checkpoint); continue with: sbatch [the same options] jobs/slurm/train.sbatch --resume $run"
        return 69
    fi
    [[ -z ${SLURM_ARRAY_TASK_ID:-} ]] || me=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
    if ! scontrol requeue "$me"; then
        g3_log "error: a rank stopped answering (status 69), and scontrol requeue $me failed; continue with:" \
            "sbatch [the same options] jobs/slurm/train.sbatch --resume $run"
        return 69
    fi
    g3_log "a rank stopped answering (status 69): job $me requeued, its restart resumes $run from its checkpoint"
    return 0
}

# g3_train_job RANKS PPN ARGS...: g3-train as a batch job that survives its time limit. It stops (a checkpoint,
# status 75) G3_STOP_MARGIN seconds before the job's end (--time-limit, unless ARGS or G3_TIMEOUT give one) or on
# SIGUSR1 to the batch shell; then the job requeues itself (`scontrol requeue`: same job ID, so the same default
# run directory, and the same options) and its restart (SLURM_RESTART_COUNT > 0) resumes the run directory from
# its checkpoint with RUN/config.toml's settings. A SIGTERM (scancel) or a stop signal sent to the ranks only
# (`scancel --signal=USR1 JOB`) never requeues: the job exits 75 and says how to continue.
g3_train_job() {
    local n=$1 ppn=$2 run limit="" margin=${G3_STOP_MARGIN:-120} left t0=$SECONDS rc=0
    shift 2
    local args=("$@")
    [[ $margin =~ ^[0-9]+$ ]] || g3_die "G3_STOP_MARGIN must be a whole number of seconds, got '$margin'"
    g3_flag G3_REQUEUE 1 || true
    g3_stop_traps
    run=$(g3_run_dir_of "${args[@]}") || exit 1
    if ((${SLURM_RESTART_COUNT:-0} > 0)); then
        if [[ -f $run/checkpoint.pt ]]; then
            g3_log "restart ${SLURM_RESTART_COUNT} of job ${SLURM_JOB_ID}: resuming $run from its checkpoint"
            # RUN/config.toml holds the run's settings as the first start resolved them
            args=(--resume "$run")
            local G3_TRAIN_ARGS="" G3_CONFIG=""
        else
            # the first start stopped before its first checkpoint: its partial files in RUN are this job's own
            g3_log "restart ${SLURM_RESTART_COUNT} of job ${SLURM_JOB_ID}: $run has no checkpoint yet:" \
                "starting as submitted, replacing what the first start wrote there"
            g3_has_opt --force "${args[@]}" || args+=(--force)
        fi
    fi
    if ((margin > 0)) && [[ -z ${G3_TIMEOUT:-} ]] && ! g3_has_opt --time-limit ${G3_TRAIN_ARGS:-} "${args[@]}"; then
        local got=0
        left=$(g3_seconds_left) || got=$?
        if ((got == 0 && left > margin)); then
            limit=$((left - margin))
            args+=(--time-limit "$limit")
        elif ((got == 0)); then
            g3_log "warning: the job has $left s left, not more than G3_STOP_MARGIN=$margin: no stop before its end"
        elif ((got == 2)); then
            g3_log "warning: squeue cannot tell the job's time left: it stops only on SIGUSR1 (--signal=B:USR1@T)"
        fi
    fi
    g3_stage train "$n" "" "$ppn" "${args[@]}" || rc=$?
    if ((rc == 69)); then   # a rank stopped answering (a node that swaps, a hung filesystem): retry from the checkpoint
        g3_requeue_stalled "$run"
        return $?
    fi
    ((rc == 75)) || return "$rc"
    local why="" again="sbatch [the same options] jobs/slurm/train.sbatch --resume $run"
    if ((G3_CANCELLED)); then
        g3_log "stopped after SIGTERM (scancel): not requeued; continue with: $again"
        return 75
    elif ((G3_WARNED)); then
        why="the time-limit warning (SIGUSR1)"
    elif [[ -n $limit ]] && ((SECONDS - t0 >= limit)); then
        why="the job's time limit (--time-limit $limit, $margin s before its end)"
    else
        g3_log "stopped by a signal to the ranks: not requeued; continue with: $again"
        return 75
    fi
    if ! g3_flag G3_REQUEUE 1; then
        g3_log "stopped by $why; G3_REQUEUE=0: not requeued; continue with: $again"
        return 75
    fi
    # an array element by its array name: the array's own job ID (which one element has) would requeue them all
    local me=$SLURM_JOB_ID
    [[ -z ${SLURM_ARRAY_TASK_ID:-} ]] || me=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
    if ! scontrol requeue "$me"; then
        g3_log "error: stopped by $why, but scontrol requeue $me failed (submitted with --no-requeue," \
            "or JobRequeue=0 and no --requeue?); continue with: $again"
        return 75
    fi
    g3_log "stopped by $why with $run/checkpoint.pt written: job $me requeued, its restart resumes $run"
    return 0
}
