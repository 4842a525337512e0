#!/usr/bin/env bash
# tests/slurm/stop.sh -- stop the test Slurm daemons that tests/slurm/start.sh
# started (recorded in $STATE_DIR/started with pid files).  Daemons this
# script did not start (e.g. a munged that was already running) are left alone.
# Idempotent: running it when nothing is up does nothing.  The config, state
# and logs (/etc/slurm/slurm.conf, /var/lib/plantbench-slurm,
# /var/log/plantbench-slurm) are kept, so a later start.sh is fast.
set -euo pipefail

STATE_DIR=${PLANTBENCH_SLURM_STATE:-/run/plantbench-slurm}
RECORD=$STATE_DIR/started
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
log() { echo "[slurm-stop] $*"; }

if [ ! -f "$RECORD" ]; then
    log "nothing recorded in $RECORD; nothing to stop"
    exit 0
fi

stop_one() {  # stop_one NAME: SIGTERM, wait up to 15 s, then SIGKILL
    local name=$1 f=$STATE_DIR/$1.pid pid
    if [ ! -s "$f" ]; then log "$name: no pid file"; return 0; fi
    pid=$(cat "$f")
    if [ -d "/proc/$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 150); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        if [ -d "/proc/$pid" ]; then
            log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped $name (pid $pid)"
    else
        log "$name (pid $pid) not running"
    fi
    rm -f "$f"
}

# cancel jobs still on our node first, so no orphaned slurmstepd/job
# processes outlive slurmd
if grep -qx slurmctld "$RECORD" && scontrol ping 2>/dev/null | grep -q UP; then
    if [ -n "$(squeue -h -p debug -t RUNNING,PENDING,CONFIGURING,COMPLETING,SUSPENDED -o %i 2>/dev/null)" ]; then
        log "cancelling jobs still queued/running in partition debug"
        scancel -p debug 2>/dev/null || true
        for _ in $(seq 30); do
            [ -z "$(squeue -h -p debug -t RUNNING,PENDING,CONFIGURING,COMPLETING,SUSPENDED -o %i 2>/dev/null)" ] && break; sleep 0.5
        done
    fi
fi
# reverse start order: slurmd, slurmctld, then munged (only if recorded)
for d in slurmd slurmctld munged; do
    grep -qx "$d" "$RECORD" && stop_one "$d"
done
rm -f "$RECORD"
log "done"
