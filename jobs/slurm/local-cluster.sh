#!/usr/bin/env bash
# A real SLURM cluster of one or more nodes on this machine, for the tests and for trying the batch jobs.
#
#   jobs/slurm/local-cluster.sh start    install slurm-wlm if missing, write slurm.conf, start munged,
#                                        slurmctld and one slurmd per node, wait until every node is idle
#   jobs/slurm/local-cluster.sh stop     stop each daemon by its recorded PID and check it is gone
#   jobs/slurm/local-cluster.sh status   daemons, node states and queue
#   jobs/slurm/local-cluster.sh env      print `export SLURM_CONF=...` (eval "$(... env)" to use sbatch/srun)
#
# Everything the cluster owns lives under $G3_SLURM_DIR (default /tmp/g3-slurm): slurm.conf, a private MUNGE key
# and socket, controller state, one slurmd spool per node, logs and PID files. Clients find the cluster through
# SLURM_CONF=$G3_SLURM_DIR/slurm.conf, or without it through a link from their default /etc/slurm/slurm.conf to
# it, which start makes only where that path is free (no file, or a dangling link) and stop removes; the host's
# own SLURM or MUNGE (if any) is left alone. start, stop and status are idempotent. Needs root (SlurmUser=root,
# munged runs as user munge).
#
# Several nodes: Debian's slurm-wlm is built with --enable-multiple-slurmd (scontrol show config:
# MULTIPLE_SLURMD=Yes), so the nodes are plain slurmd processes on this host, each started with -N NAME and
# listening on its own Port (one NodeName line each, NodeHostname this host); spool, log and PID file are per
# node (%n). No namespaces or virtual interfaces are needed, so stop has only processes to end.
#
# Environment:
#   G3_SLURM_DIR        state directory (default /tmp/g3-slurm)
#   G3_SLURM_NODES      number of nodes (default 1: one node named after this host; N > 1: HOST-1 .. HOST-N)
#   G3_SLURM_CPUS       CPUs each node advertises (default: the CPUs this process may run on, whatever
#                       OMP_NUM_THREADS says). More than the real count lets a job run more tasks than cores,
#                       e.g. G3_SLURM_CPUS=4 on a 2-core machine for 4-rank jobs. The nodes share the host's cores.
#   G3_SLURM_MEMORY     RealMemory in MiB of each node (default: 90% of MemTotal)
#   G3_SLURM_CTLD_PORT  slurmctld port (default 6817); G3_SLURM_SLURMD_PORT the first node's slurmd port
#                       (default 6818; node i listens on it + i - 1)
#   G3_SLURM_CONF_LINK  the clients' default slurm.conf to link to this cluster's (default /etc/slurm/slurm.conf;
#                       empty: make no link)
#   G3_SLURM_TIMEOUT    seconds to wait for each daemon / for the nodes to become idle (default 60)
#
# Exit status: 0 success, 1 failure (with the daemons' log tails), 3 SLURM cannot run here (not root, or
# slurm-wlm missing and no apt-get), so callers such as the tests can skip with this script's reason.
set -euo pipefail

DIR=${G3_SLURM_DIR:-/tmp/g3-slurm}
CTLD_PORT=${G3_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${G3_SLURM_SLURMD_PORT:-6818}
NODES=${G3_SLURM_NODES:-1}
CONF_LINK=${G3_SLURM_CONF_LINK-/etc/slurm/slurm.conf}
TIMEOUT=${G3_SLURM_TIMEOUT:-60}
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
PARTITION=debug

log() { echo "local-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }
unavailable() { log "unavailable: $*"; exit 3; }

# node_names: the nodes to write into slurm.conf, one per line
node_names() {
    local i
    if ((NODES == 1)); then
        hostname -s
    else
        for ((i = 1; i <= NODES; i++)); do echo "$(hostname -s)-$i"; done
    fi
}

# conf_nodes: the nodes of the slurm.conf written at the last start (what stop and status act on)
conf_nodes() {
    if [[ -f $CONF ]]; then sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$CONF"; fi
}

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

pidfile_of() {  # pidfile_of DAEMON [NODE]
    case $1 in
        munged) echo "$MUNGE_DIR/munged.pid" ;;
        slurmctld) echo "$DIR/run/slurmctld.pid" ;;
        slurmd) echo "$DIR/run/slurmd-$2.pid" ;;
    esac
}

logfile_of() {  # logfile_of DAEMON [NODE]
    case $1 in
        munged) echo "$MUNGE_DIR/munged.log" ;;
        slurmd) echo "$DIR/log/slurmd-$2.log" ;;
        *) echo "$DIR/log/$1.log" ;;
    esac
}

show_log_tail() {  # show_log_tail DAEMON [NODE]
    local f
    f=$(logfile_of "$1" "${2:-}")
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

# the CPUs this process may run on (its affinity mask, as os.sched_getaffinity); plain nproc honours
# OMP_NUM_THREADS, and with OMP_NUM_THREADS=1 (usual on HPC systems) the node got CPUs=1, so every 2-task job
# pended for ever
detect_cpus() {
    if [[ -n ${G3_SLURM_CPUS:-} ]]; then
        echo "$G3_SLURM_CPUS"
    else
        env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
    fi
}

detect_memory() {
    if [[ -n ${G3_SLURM_MEMORY:-} ]]; then
        echo "$G3_SLURM_MEMORY"
    else
        awk '/^MemTotal:/ { printf "%d\n", $2 / 1024 * 0.9 }' /proc/meminfo
    fi
}

write_conf() {
    local host nodes cpus mem node port i=0 lines=""
    host=$(hostname -s)
    [[ $NODES =~ ^[1-9][0-9]*$ ]] || die "bad node count '$NODES' (G3_SLURM_NODES)"
    nodes=$(node_names)
    cpus=$(detect_cpus)
    mem=$(detect_memory)
    [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "bad CPU count '$cpus' (G3_SLURM_CPUS)"
    [[ $mem =~ ^[1-9][0-9]*$ ]] || die "bad memory size '$mem' MiB (G3_SLURM_MEMORY)"
    [[ $SLURMD_PORT =~ ^[1-9][0-9]*$ ]] && ((SLURMD_PORT + NODES - 1 <= 65535)) ||
        die "bad slurmd port '$SLURMD_PORT' for $NODES node(s) (G3_SLURM_SLURMD_PORT)"
    for node in $nodes; do
        port=$((SLURMD_PORT + i))
        i=$((i + 1))
        lines+="NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus RealMemory=$mem"
        lines+=$' State=UNKNOWN\n'
    done
    # Job IDs must not repeat across restarts: MPICH names its shared-memory segment after the PMI job name
    # ("jobid.stepid" under srun), and a step killed by MPI_Abort leaves its segment in /dev/shm, which a later
    # step with the same name would attach to ("Invalid GenQ flag" in MPI_Init). So start from a clock-derived
    # ID (below the default MaxJobId of 67043328).
    local first_job=$(( ($(date +%s) % 600000) * 100 + 1 ))
    cat >"$CONF.tmp" <<EOF
# written by jobs/slurm/local-cluster.sh for host $host; regenerated on every start
ClusterName=g3local
FirstJobId=$first_job
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
# %n: the node's name, so that every slurmd of this host has its own spool, PID file and log
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a job whose dependency can never be satisfied (an afterok on a failed job) is cancelled, not left pending
DependencyParameters=kill_invalid_depend
# a job that asks for more than the partition's nodes can give is refused at submission, not left pending for
# ever with Reason=PartitionConfig
EnforcePartLimits=ALL
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
${lines}PartitionName=$PARTITION Nodes=$(paste -sd, <<<"$nodes") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
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
    wait_for "$TIMEOUT" "munge to answer" munge_works ||
        { show_log_tail munged; die "munge does not answer on $MUNGE_SOCKET"; }
    log "munged running (pid $(<"$pidf"), socket $MUNGE_SOCKET)"
}

start_daemon() {  # start_daemon NAME NODE ARGS...: NODE names the slurmd (empty for the other daemons)
    local name=$1 node=$2 pidf what
    shift 2
    pidf=$(pidfile_of "$name" "$node")
    what=$name${node:+ of node $node}
    if pid_alive "$pidf" "$name"; then
        log "$what already running (pid $(<"$pidf"))"
        return
    fi
    rm -f "$pidf"
    "$name" "$@" || { show_log_tail "$name" "$node"; die "$what did not start"; }
    wait_for "$TIMEOUT" "$what" pid_alive "$pidf" "$name" ||
        { show_log_tail "$name" "$node"; die "$what did not start"; }
    log "$what running (pid $(<"$pidf"))"
}

node_state() { SLURM_CONF=$CONF sinfo -h -n "$1" -o %T 2>/dev/null | head -n 1; }

node_idle() { [[ $(node_state "$1") == idle ]]; }

wait_idle() {  # wait_idle NODE: wait until NODE is idle, resuming it once if it came up down or drained
    local node=$1 state
    wait_for "$TIMEOUT" "node $node to become idle" node_idle "$node" && return 0
    state=$(node_state "$node")
    case $state in
        down* | drain* | fail*)
            log "node $node is '$state'; resuming it"
            scontrol update NodeName="$node" State=RESUME || true
            wait_for "$TIMEOUT" "node $node to become idle" node_idle "$node" && return 0
            ;;
    esac
    show_log_tail slurmctld
    show_log_tail slurmd "$node"
    die "node $node is '$(node_state "$node")', not idle"
}

# any_slurmd_alive: a slurmd of this cluster runs (whatever slurm.conf now says; slurmd.pid: a cluster started by
# an earlier version of this script)
any_slurmd_alive() {
    local f
    for f in "$DIR"/run/slurmd*.pid; do
        pid_alive "$f" slurmd && return 0
    done
    return 1
}

# link_conf: point the clients' default slurm.conf at this cluster's, so that sinfo, sbatch and srun work in any
# new shell; only where nothing is there (or a dangling link, which serves no one)
link_conf() {
    [[ -n $CONF_LINK ]] || return 1
    if [[ -L $CONF_LINK && $(readlink "$CONF_LINK") == "$CONF" ]]; then
        echo "$CONF_LINK" >"$DIR/run/conf-link"
        return 0
    fi
    if [[ -L $CONF_LINK && ! -e $CONF_LINK ]]; then
        rm -f "$CONF_LINK"
    fi
    if [[ -e $CONF_LINK || -L $CONF_LINK ]]; then
        log "$CONF_LINK exists (another SLURM's configuration): left alone"
        return 1
    fi
    [[ -d $(dirname "$CONF_LINK") ]] || { log "$(dirname "$CONF_LINK") does not exist: no link made"; return 1; }
    ln -s "$CONF" "$CONF_LINK" 2>/dev/null || { log "could not link $CONF_LINK to $CONF"; return 1; }
    echo "$CONF_LINK" >"$DIR/run/conf-link"   # for stop, whatever G3_SLURM_CONF_LINK says then
    log "linked $CONF_LINK -> $CONF"
}

unlink_conf() {  # remove the link start made, if it still points here
    local link
    link=$(cat "$DIR/run/conf-link" 2>/dev/null || true)
    if [[ -n $link && -L $link && $(readlink "$link") == "$CONF" ]]; then
        rm -f "$link"
        log "removed the link $link"
    fi
    rm -f "$DIR/run/conf-link"
}

cmd_start() {
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    ensure_installed
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
    if ! pid_alive "$(pidfile_of slurmctld)" slurmctld && ! any_slurmd_alive; then
        write_conf
    elif [[ -n ${G3_SLURM_NODES:-} && $(conf_nodes | wc -l) != "$NODES" ]]; then
        die "the cluster in $DIR runs with $(conf_nodes | wc -l) node(s), not $NODES (G3_SLURM_NODES): stop it first"
    fi
    export SLURM_CONF=$CONF
    start_munged
    start_daemon slurmctld "" -i -f "$CONF"
    wait_for "$TIMEOUT" "slurmctld to answer" scontrol ping ||
        { show_log_tail slurmctld; die "slurmctld does not answer"; }
    local node nodes
    nodes=$(conf_nodes)
    [[ -n $nodes ]] || die "$CONF names no node: stop the cluster and start it again"
    for node in $nodes; do
        mkdir -p "$DIR/spool/$node"
        start_daemon slurmd "$node" -f "$CONF" -N "$node"
    done
    for node in $nodes; do
        wait_idle "$node"
    done
    log "cluster up: $(wc -w <<<"$nodes") node(s) idle ($(paste -sd, <<<"$nodes")), $(awk -F'CPUs=' \
        '/^NodeName=/ { split($2, a, " "); print a[1]; exit }' "$CONF") CPUs each, partition $PARTITION"
    if link_conf; then
        log "sinfo, sbatch and srun find it through $CONF_LINK (or: export SLURM_CONF=$CONF)"
    else
        log "use it with: export SLURM_CONF=$CONF   (or: eval \"\$($0 env)\")"
    fi
}

stop_daemon() {  # stop_daemon NAME PIDFILE: SIGTERM the recorded PID, wait, SIGKILL if needed, verify it is gone
    local name=$1 pidf=$2 pid
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
    if pid_alive "$(pidfile_of slurmctld)" slurmctld && any_slurmd_alive; then
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
    # the slurmds first (they end job steps), then the controller, then munge, which all of them use
    local f
    for f in "$DIR"/run/slurmd*.pid; do
        [[ -e $f ]] || continue
        stop_daemon slurmd "$f" || rc=1
    done
    stop_daemon slurmctld "$(pidfile_of slurmctld)" || rc=1
    stop_daemon munged "$(pidfile_of munged)" || rc=1
    unlink_conf
    if [[ $first_job =~ ^[0-9]+$ && $next_job =~ ^[0-9]+$ ]]; then
        remove_mpich_segments "$first_job" "$next_job"
    fi
    return $rc
}

cmd_status() {
    local name node rc=0
    for name in munged slurmctld; do
        if pid_alive "$(pidfile_of "$name")" "$name"; then
            echo "$name: running (pid $(<"$(pidfile_of "$name")"))"
        else
            echo "$name: stopped"
            rc=1
        fi
    done
    for node in $(conf_nodes); do
        if pid_alive "$(pidfile_of slurmd "$node")" slurmd; then
            echo "slurmd: running (pid $(<"$(pidfile_of slurmd "$node")")) as node $node"
        else
            echo "slurmd: stopped (node $node)"
            rc=1
        fi
    done
    [[ -f $CONF ]] || { echo "slurmd: stopped (no $CONF)"; rc=1; }
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
