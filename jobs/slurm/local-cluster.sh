#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the tests and for trying the batch jobs.
#
#   jobs/slurm/local-cluster.sh start    install slurm-wlm if missing, write slurm.conf, start munged,
#                                        slurmctld and slurmd, wait until the node is idle
#   jobs/slurm/local-cluster.sh stop     stop each daemon by its recorded PID and check it is gone
#   jobs/slurm/local-cluster.sh status   daemons, node state and queue
#   jobs/slurm/local-cluster.sh env      print `export SLURM_CONF=...` (eval "$(... env)" to use sbatch/srun)
#
# Everything the cluster owns lives under $G3_SLURM_DIR (default /tmp/g3-slurm): slurm.conf, a private MUNGE key
# and socket, controller state, slurmd spool, logs and PID files. Nothing is written to /etc, so the host's own
# SLURM or MUNGE (if any) is left alone. Clients find the cluster through SLURM_CONF=$G3_SLURM_DIR/slurm.conf.
# start and stop are idempotent. Needs root (SlurmUser=root, munged runs as user munge).
#
# Environment:
#   G3_SLURM_DIR        state directory (default /tmp/g3-slurm)
#   G3_SLURM_CPUS       CPUs the node advertises (default: detected). More than the real count lets a job run
#                       more tasks than cores, e.g. G3_SLURM_CPUS=4 on a 2-core machine for 4-rank jobs.
#   G3_SLURM_MEMORY     RealMemory in MiB (default: 90% of MemTotal)
#   G3_SLURM_CTLD_PORT  slurmctld port (default 6817); G3_SLURM_SLURMD_PORT slurmd port (default 6818)
#   G3_SLURM_TIMEOUT    seconds to wait for each daemon / for the node to become idle (default 60)
#
# Exit status: 0 success, 1 failure (with the daemons' log tails), 3 SLURM cannot run here (not root, or
# slurm-wlm missing and no apt-get), so callers such as the tests can skip with this script's reason.
set -euo pipefail

DIR=${G3_SLURM_DIR:-/tmp/g3-slurm}
CTLD_PORT=${G3_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${G3_SLURM_SLURMD_PORT:-6818}
TIMEOUT=${G3_SLURM_TIMEOUT:-60}
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
PARTITION=debug

log() { echo "local-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }
unavailable() { log "unavailable: $*"; exit 3; }

node_name() { hostname -s; }

# proc_alive PID NAME: PID is a live process (not a zombie awaiting its parent) whose command name is NAME
# (guards against a PID reused by another program)
proc_alive() {
    local pid=$1 name=$2 state
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ $(cat /proc/"$pid"/comm 2>/dev/null) == "$name" ]] || return 1
    state=$(awk '/^State:/ { print $2 }' /proc/"$pid"/status 2>/dev/null)
    [[ -n $state && $state != Z ]]
}

# pid_alive FILE NAME: the PID recorded in FILE is a live NAME
pid_alive() {
    [[ -s $1 ]] && proc_alive "$(<"$1")" "$2"
}

pidfile_of() {
    case $1 in
        munged) echo "$MUNGE_DIR/munged.pid" ;;
        slurmctld) echo "$DIR/run/slurmctld.pid" ;;
        slurmd) echo "$DIR/run/slurmd.pid" ;;
    esac
}

logfile_of() {
    case $1 in
        munged) echo "$MUNGE_DIR/munged.log" ;;
        *) echo "$DIR/log/$1.log" ;;
    esac
}

show_log_tail() {
    local f
    f=$(logfile_of "$1")
    if [[ -f $f ]]; then
        log "last lines of $f:"
        tail -n 20 "$f" >&2 || true
    fi
}

ensure_installed() {
    [[ $(id -u) == 0 ]] || unavailable "needs root (SlurmUser=root, munged runs as user munge); running as $(id -un)"
    local need=0 cmd
    for cmd in slurmctld slurmd sbatch srun sinfo munged; do
        command -v "$cmd" >/dev/null 2>&1 || need=1
    done
    if ((need)); then
        command -v apt-get >/dev/null 2>&1 || unavailable "slurm-wlm is not installed and apt-get is not available"
        log "installing slurm-wlm and munge (apt-get)"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$DIR/apt.log" 2>&1; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$DIR/apt.log" 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >>"$DIR/apt.log" 2>&1 ||
                { tail -n 20 "$DIR/apt.log" >&2; unavailable "apt-get install slurm-wlm failed (log: $DIR/apt.log)"; }
        fi
    fi
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist (the munge package creates it)"
}

detect_cpus() {
    if [[ -n ${G3_SLURM_CPUS:-} ]]; then echo "$G3_SLURM_CPUS"; else nproc; fi
}

detect_memory() {
    if [[ -n ${G3_SLURM_MEMORY:-} ]]; then
        echo "$G3_SLURM_MEMORY"
    else
        awk '/^MemTotal:/ { printf "%d\n", $2 / 1024 * 0.9 }' /proc/meminfo
    fi
}

write_conf() {
    local node cpus mem
    node=$(node_name)
    cpus=$(detect_cpus)
    mem=$(detect_memory)
    [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "bad CPU count '$cpus' (G3_SLURM_CPUS)"
    [[ $mem =~ ^[1-9][0-9]*$ ]] || die "bad memory size '$mem' MiB (G3_SLURM_MEMORY)"
    # Job IDs must not repeat across restarts: MPICH names its shared-memory segment after the PMI job name
    # ("jobid.stepid" under srun), and a step killed by MPI_Abort leaves its segment in /dev/shm, which a later
    # step with the same name would attach to ("Invalid GenQ flag" in MPI_Init). So start from a clock-derived
    # ID (below the default MaxJobId of 67043328).
    local first_job=$(( ($(date +%s) % 600000) * 100 + 1 ))
    cat >"$CONF.tmp" <<EOF
# written by jobs/slurm/local-cluster.sh for host $node; regenerated on every start
ClusterName=g3local
FirstJobId=$first_job
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a job whose dependency can never be satisfied (an afterok on a failed job) is cancelled, not left pending
DependencyParameters=kill_invalid_depend
MpiDefault=pmi2
# the node advertises what this file says (G3_SLURM_CPUS may exceed the real core count)
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
SlurmctldTimeout=60
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    mv "$CONF.tmp" "$CONF"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.5 s
    local secs=$1 what=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || { log "timed out after ${secs}s waiting for $what"; return 1; }
        sleep 0.5
    done
}

start_munged() {
    local pidf
    pidf=$(pidfile_of munged)
    if pid_alive "$pidf" munged; then
        log "munged already running (pid $(<"$pidf"))"
        return
    fi
    install -d -m 0755 -o munge -g munge "$MUNGE_DIR"
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key.tmp"
        chown munge:munge "$MUNGE_DIR/munge.key.tmp"
        chmod 0400 "$MUNGE_DIR/munge.key.tmp"
        mv "$MUNGE_DIR/munge.key.tmp" "$MUNGE_DIR/munge.key"
    fi
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$pidf"
    runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$pidf" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" ||
        { show_log_tail munged; die "munged did not start"; }
    wait_for "$TIMEOUT" "munged" pid_alive "$pidf" munged || { show_log_tail munged; die "munged did not start"; }
    munge_works() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
    wait_for "$TIMEOUT" "munge to answer" munge_works || { show_log_tail munged; die "munge does not answer on $MUNGE_SOCKET"; }
    log "munged running (pid $(<"$pidf"), socket $MUNGE_SOCKET)"
}

start_daemon() {  # start_daemon NAME ARGS...
    local name=$1 pidf
    shift
    pidf=$(pidfile_of "$name")
    if pid_alive "$pidf" "$name"; then
        log "$name already running (pid $(<"$pidf"))"
        return
    fi
    rm -f "$pidf"
    "$name" "$@" || { show_log_tail "$name"; die "$name did not start"; }
    wait_for "$TIMEOUT" "$name" pid_alive "$pidf" "$name" || { show_log_tail "$name"; die "$name did not start"; }
    log "$name running (pid $(<"$pidf"))"
}

node_state() { SLURM_CONF=$CONF sinfo -h -n "$(node_name)" -o %T 2>/dev/null | head -n 1; }

node_idle() { [[ $(node_state) == idle ]]; }

cmd_start() {
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    ensure_installed
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
    if ! pid_alive "$(pidfile_of slurmctld)" slurmctld && ! pid_alive "$(pidfile_of slurmd)" slurmd; then
        write_conf
    fi
    export SLURM_CONF=$CONF
    start_munged
    start_daemon slurmctld -i -f "$CONF"
    wait_for "$TIMEOUT" "slurmctld to answer" scontrol ping || { show_log_tail slurmctld; die "slurmctld does not answer"; }
    start_daemon slurmd -f "$CONF" -N "$(node_name)"
    if ! wait_for "$TIMEOUT" "node $(node_name) to become idle" node_idle; then
        local state
        state=$(node_state)
        case $state in
            down* | drain* | fail*)
                log "node is '$state'; resuming it"
                scontrol update NodeName="$(node_name)" State=RESUME || true
                wait_for "$TIMEOUT" "node to become idle" node_idle ||
                    { show_log_tail slurmctld; show_log_tail slurmd; die "node $(node_name) is '$(node_state)', not idle"; }
                ;;
            *) show_log_tail slurmctld; show_log_tail slurmd; die "node $(node_name) is '$state', not idle" ;;
        esac
    fi
    log "cluster up: node $(node_name) idle, $(detect_cpus) CPUs, partition $PARTITION"
    log "use it with: export SLURM_CONF=$CONF"
}

stop_daemon() {  # stop_daemon NAME: SIGTERM the recorded PID, wait, SIGKILL if needed, verify it is gone
    local name=$1 pidf pid
    pidf=$(pidfile_of "$name")
    if ! pid_alive "$pidf" "$name"; then
        rm -f "$pidf"
        return 0
    fi
    pid=$(<"$pidf")
    kill -TERM "$pid" 2>/dev/null || true
    gone() { ! proc_alive "$pid" "$name"; }
    if ! wait_for 20 "$name (pid $pid) to exit" gone; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_for 10 "$name (pid $pid) to die" gone || { log "error: $name (pid $pid) is still running"; return 1; }
    fi
    rm -f "$pidf"
    log "$name (pid $pid) stopped"
}

# remove_mpich_segments FIRST NEXT: MPICH names its shared-memory segments mpich_{shm,vci}_<FNV-1a of the PMI job
# name>_<node>, and under srun the PMI job name is "jobid.stepid". A step killed by MPI_Abort never unlinks its
# segment, so /dev/shm would keep a few MB per failed job. Remove those of this cluster's jobs FIRST..NEXT-1.
remove_mpich_segments() {
    command -v python3 >/dev/null 2>&1 || return 0
    python3 - "$1" "$2" <<'PY' || true
import os, sys
first, nxt = int(sys.argv[1]), int(sys.argv[2])
def fnv1a(s):
    h = 2166136261
    for c in s.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return "%x" % h
ours = {fnv1a(f"{job}.{step}") for job in range(first, nxt) for step in range(64)}
for name in os.listdir("/dev/shm"):
    parts = name.split("_")
    if len(parts) == 4 and parts[0] == "mpich" and parts[1] in ("shm", "vci") and parts[2] in ours:
        try:
            os.unlink(os.path.join("/dev/shm", name))
            print(f"local-cluster: removed /dev/shm/{name} left by an aborted job step", file=sys.stderr)
        except OSError:
            pass
PY
}

cmd_stop() {
    local rc=0 first_job="" next_job=""
    [[ -d $DIR ]] || { log "nothing to stop ($DIR does not exist)"; return 0; }
    if [[ -f $CONF ]] && pid_alive "$(pidfile_of slurmctld)" slurmctld; then
        first_job=$(sed -n 's/^FirstJobId=//p' "$CONF")
        next_job=$(SLURM_CONF=$CONF scontrol show config 2>/dev/null | awk '$1 == "NEXT_JOB_ID" { print $3 }')
    fi
    if pid_alive "$(pidfile_of slurmctld)" slurmctld && pid_alive "$(pidfile_of slurmd)" slurmd; then
        # end the cluster's jobs first, so that slurmd takes their steps (slurmstepd) down with them
        local jobs
        jobs=$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(tr "\n" " " <<<"$jobs")"
            # shellcheck disable=SC2086
            SLURM_CONF=$CONF scancel $jobs || true
            queue_empty() { [[ -z $(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null) ]]; }
            wait_for 30 "the cancelled jobs to end" queue_empty || true
        fi
    fi
    # slurmd first (it ends job steps), then the controller, then munge, which both of them use
    stop_daemon slurmd || rc=1
    stop_daemon slurmctld || rc=1
    stop_daemon munged || rc=1
    if [[ $first_job =~ ^[0-9]+$ && $next_job =~ ^[0-9]+$ ]]; then
        remove_mpich_segments "$first_job" "$next_job"
    fi
    return $rc
}

cmd_status() {
    local name rc=0
    for name in munged slurmctld slurmd; do
        if pid_alive "$(pidfile_of "$name")" "$name"; then
            echo "$name: running (pid $(<"$(pidfile_of "$name")"))"
        else
            echo "$name: stopped"
            rc=1
        fi
    done
    if ((rc == 0)); then
        echo "SLURM_CONF=$CONF"
        SLURM_CONF=$CONF sinfo || rc=1
        SLURM_CONF=$CONF squeue || rc=1
    fi
    return $rc
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *)
        echo "usage: $0 start|stop|status|env" >&2
        exit 2
        ;;
esac
