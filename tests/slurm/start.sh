#!/usr/bin/env bash
# tests/slurm/start.sh -- bring up a real single-node Slurm "cluster" on this
# host for tests and CI (Debian, run as root, no systemd needed).
#
# What it does (idempotent; running it again while the cluster is up is a no-op):
#   1. apt-get installs slurm-wlm + munge if slurmctld/slurmd/munged/sbatch are
#      missing (DEBIAN_FRONTEND=noninteractive).
#   2. writes /etc/slurm/slurm.conf (marked "written by plantbench
#      tests/slurm/start.sh"); node CPUs/RealMemory come from `slurmd -C`.
#      A pre-existing slurm.conf NOT written by this script makes it refuse,
#      unless PLANTBENCH_SLURM_FORCE=1 (then it is backed up to
#      /etc/slurm/slurm.conf.plantbench-backup.<timestamp>).
#   3. creates the munge key if missing, /run/munge (owned by munge), and
#      starts munged, slurmctld -D, slurmd -D -N localhost in the background.
#      Pid files and the list of daemons THIS script started live in
#      $STATE_DIR (default /run/plantbench-slurm); tests/slurm/stop.sh stops
#      only those.  An already-running munged that we did not start is reused.
#   4. waits until `sinfo` shows node `localhost` idle (timeout
#      PLANTBENCH_SLURM_TIMEOUT, default 60 s) and prints the bring-up time.
#
# ACCOUNTING FINDING (Debian bookworm, Slurm 22.05.8, munge 0.5.15,
# snakemake 9.27.1 + snakemake-executor-plugin-slurm 2.8.0):
#   * The plugin's default status command is `sacct` whenever the `sacct`
#     binary exists -- and it always exists (package slurm-client).  With
#     AccountingStorageType=accounting_storage/none, `sacct` exits 1 with
#       "sacct: error: Slurm accounting storage is disabled"
#     The plugin logs that only with --verbose ("could not check status of
#     job <uuid>"), then drops the job and loops on "No active jobs; skipping
#     status query." forever: the job is COMPLETED in Slurm, its output
#     exists, snakemake never exits (tested; even SIGTERM needed SIGKILL).
#   * Chosen approach: no slurmdbd/MariaDB.  MinJobAge=900 keeps finished jobs
#     in slurmctld's memory for 15 minutes, and the test profile
#     (profiles/slurm-cpu-test) sets `slurm-status-command: squeue`; the
#     plugin then runs `squeue --states=all --name <run-uuid>` which reports
#     COMPLETED/FAILED/... for finished jobs.  Caveat built into the plugin:
#     it silently falls back to `sacct` when MinJobAge < 3 *
#     slurm-init-seconds-before-status-checks (default 3*40 s = 120 s), so
#     MinJobAge must stay well above that.  Failed jobs are reported as
#     "Detailed failure reason unavailable (status command is not 'sacct')".
#     This needs no database, installs nothing beyond slurm-wlm+munge and
#     comes up in seconds; slurmdbd+MariaDB would add a DB server, a second
#     daemon and sacctmgr cluster/account setup for no test benefit.
#   * JobCompType=jobcomp/filetxt writes one line per finished job (JobId,
#     Name, State, NodeCnt, ProcCnt, ...) to $LOG_DIR/jobcomp.log, so tests
#     can see which jobs ran, with how many CPUs, and how they ended (the
#     plugin names every job after the snakemake run uuid and puts
#     "rule_<name>_wildcards_..." into the job comment; `squeue -O` or
#     `scontrol show job` show the comment while the job is in memory).
#   * The plugin's job step (`srun ... snakemake --executor slurm-jobstep`)
#     strips SLURM_* variables, so SLURM_CONF is not honoured inside jobs: the
#     config must be at the default /etc/slurm/slurm.conf.
#
# Environment knobs:
#   PLANTBENCH_SLURM_STATE   state dir (pid files, record)  [/run/plantbench-slurm]
#   PLANTBENCH_SLURM_TIMEOUT seconds to wait for idle node   [60]
#   PLANTBENCH_SLURM_FORCE=1 back up a foreign /etc/slurm/slurm.conf and replace it
#   PLANTBENCH_SLURM_MEM_RESERVE_MB  MB of RAM kept from Slurm            [512]
set -euo pipefail

T0=$(date +%s.%N)
STATE_DIR=${PLANTBENCH_SLURM_STATE:-/run/plantbench-slurm}
TIMEOUT=${PLANTBENCH_SLURM_TIMEOUT:-60}
MEM_RESERVE=${PLANTBENCH_SLURM_MEM_RESERVE_MB:-512}
LIB_DIR=/var/lib/plantbench-slurm
LOG_DIR=/var/log/plantbench-slurm
CONF=/etc/slurm/slurm.conf
MARKER="# Written by plantbench tests/slurm/start.sh -- do not edit, rerun the script."
RECORD=$STATE_DIR/started      # one daemon name per line, only those we started
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

log() { echo "[slurm-start] $*"; }
die() { echo "[slurm-start] ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

# ---------------------------------------------------------------- 1. packages
need_install=0
for b in slurmctld slurmd munged sbatch sinfo squeue; do
    command -v "$b" >/dev/null 2>&1 || need_install=1
done
if [ "$need_install" = 1 ]; then
    log "installing slurm-wlm and munge with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
    log "packages installed after $(elapsed) s"
fi
id slurm >/dev/null 2>&1 || die "user 'slurm' missing (the Debian slurm packages should create it)"
id munge >/dev/null 2>&1 || die "user 'munge' missing (the Debian munge package should create it)"

# ------------------------------------------------------------ helper: pidfile
pid_alive() {  # pid_alive NAME -> 0 if $STATE_DIR/NAME.pid holds a live NAME process
    local f=$STATE_DIR/$1.pid pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [ -d "/proc/$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$1" ]
}
record() { grep -qx "$1" "$RECORD" 2>/dev/null || echo "$1" >>"$RECORD"; }

mkdir -p "$STATE_DIR" "$LIB_DIR/ctld" "$LIB_DIR/d" "$LOG_DIR" /etc/slurm
touch "$RECORD"
chown slurm:slurm "$LIB_DIR/ctld" "$LOG_DIR"

# ------------------------------------------------------------- 2. slurm.conf
if [ -e "$CONF" ] && ! head -n1 "$CONF" | grep -qF "$MARKER"; then
    if [ "${PLANTBENCH_SLURM_FORCE:-0}" = 1 ]; then
        bak=$CONF.plantbench-backup.$(date +%Y%m%d-%H%M%S)
        cp -p "$CONF" "$bak"
        log "existing $CONF was not written by this script; backed up to $bak"
    else
        die "$CONF exists and was not written by tests/slurm/start.sh.
Refusing to overwrite a real cluster configuration. If this host is a
throwaway test machine, rerun with PLANTBENCH_SLURM_FORCE=1 (the old file is
backed up to $CONF.plantbench-backup.<timestamp>)."
    fi
fi

hw=$(slurmd -C | head -n1)
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
[ -n "$cpus" ] && [ -n "$mem" ] || die "could not parse 'slurmd -C' output: $hw"
mem=$(( mem > MEM_RESERVE * 2 ? mem - MEM_RESERVE : mem ))

new_conf=$(mktemp)
cat >"$new_conf" <<EOF
$MARKER
# Single-node test cluster: CPUs/RealMemory from \`slurmd -C\` ($hw)
ClusterName=plantbench
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
# keep finished jobs visible to squeue/scontrol for 15 min (status checks with
# --slurm-status-command squeue need this; the plugin wants >= 120 s)
MinJobAge=900
# no slurmdbd: sacct does not work, see header of tests/slurm/start.sh
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
StateSaveLocation=$LIB_DIR/ctld
SlurmdSpoolDir=$LIB_DIR/d
SlurmctldPidFile=$STATE_DIR/slurmctld.daemon.pid
SlurmdPidFile=$STATE_DIR/slurmd.daemon.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
conf_changed=0
if ! cmp -s "$new_conf" "$CONF" 2>/dev/null; then
    install -m 0644 "$new_conf" "$CONF"
    conf_changed=1
    log "wrote $CONF (CPUs=$cpus RealMemory=$mem)"
fi
rm -f "$new_conf"
chmod 0755 "$STATE_DIR"

# ---------------------------------------------------------------- 3. munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating munge key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key
    else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if pid_alive munged; then
    :
elif munge_ok; then
    log "munged already running (not started by this script; will not stop it)"
else
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
    # setpriv execs munged directly (runuser would fork), so $! is munged's pid
    setsid setpriv --reuid=munge --regid=munge --init-groups munged -F \
        >>"$LOG_DIR/munged.console" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/munged.pid"
    record munged
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || die "munged did not come up; see /var/log/munge/munged.log and $LOG_DIR/munged.console"
    log "started munged (pid $(cat "$STATE_DIR/munged.pid"))"
fi

# ------------------------------------------------------------ 4. slurm daemons
stop_ours() {  # stop_ours NAME
    pid_alive "$1" || return 0
    local pid; pid=$(cat "$STATE_DIR/$1.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    rm -f "$STATE_DIR/$1.pid"
}
if [ "$conf_changed" = 1 ]; then   # config changed under running daemons: restart ours
    stop_ours slurmd; stop_ours slurmctld
fi

if pid_alive slurmctld; then
    :
elif pgrep -x slurmctld >/dev/null; then
    die "a slurmctld not started by this script is running (pid $(pgrep -x slurmctld | tr '\n' ' ')); stop it first"
else
    setsid slurmctld -D >>"$LOG_DIR/slurmctld.console" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/slurmctld.pid"
    record slurmctld
    log "started slurmctld (pid $!)"
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
scontrol ping 2>/dev/null | grep -q UP \
    || die "slurmctld not responding; see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmctld.console"

if pid_alive slurmd; then
    :
elif pgrep -x slurmd >/dev/null; then
    die "a slurmd not started by this script is running (pid $(pgrep -x slurmd | tr '\n' ' ')); stop it first"
else
    setsid slurmd -D -N localhost >>"$LOG_DIR/slurmd.console" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/slurmd.pid"
    record slurmd
    log "started slurmd (pid $!)"
fi

# ------------------------------------------------------------ 5. wait for idle
state=""
deadline=$(( $(date +%s) + TIMEOUT ))
while [ "$(date +%s)" -lt "$deadline" ]; do
    state=$(sinfo -h -N -n localhost -o %t 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mix|alloc) break ;;
        down*|drain*|drng*)
            scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
    esac
    for d in slurmctld slurmd; do
        grep -qx "$d" "$RECORD" && ! pid_alive "$d" \
            && die "$d exited during start-up; see $LOG_DIR/$d.log and $LOG_DIR/$d.console"
    done
    sleep 0.5
done
case "$state" in
    idle|mix|alloc) ;;
    *) sinfo -N -l >&2 || true
       die "node 'localhost' not idle after ${TIMEOUT}s (state '${state:-none}'); see $LOG_DIR/slurmd.log, $LOG_DIR/slurmctld.log" ;;
esac
log "cluster up: node localhost $state, partition debug, CPUs=$cpus RealMemory=$mem"
log "bring-up wall time: $(elapsed) s"
