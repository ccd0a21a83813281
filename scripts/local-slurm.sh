#!/usr/bin/env bash
# A one-node Slurm cluster on loopback for tests: munged, slurmctld and slurmd
# from the distribution's packages, every file under one private state
# directory, nothing else on the system touched.
#   scripts/local-slurm.sh start   # prints `export SLURM_CONF=...` to eval
#   scripts/local-slurm.sh stop    # stops the daemons, removes the state dir
#   scripts/local-slurm.sh check   # exit 0 when it can run here (root, packages)
# Needs root (slurmd launches jobs as their users). RANKMESH_SLURM_DIR sets
# the state directory (default /tmp/rankmesh-slurm).
set -euo pipefail
state="${RANKMESH_SLURM_DIR:-/tmp/rankmesh-slurm}"
conf="$state/slurm.conf"

check() {
  [ "$(id -u)" -eq 0 ] || { echo "local-slurm: needs root" >&2; return 1; }
  for tool in munged mungekey slurmctld slurmd sbatch srun sinfo; do
    command -v "$tool" >/dev/null 2>&1 || { echo "local-slurm: $tool not installed (apt-get install slurm-wlm munge)" >&2; return 1; }
  done
}

stop() {
  for pidfile in "$state/slurmd.pid" "$state/slurmctld.pid" "$state/munged.pid"; do
    if [ -s "$pidfile" ]; then
      pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$state"
}

start() {
  check
  stop
  mkdir -p "$state/ctld" "$state/d"
  chmod 700 "$state"
  mungekey -c -k "$state/munge.key" >/dev/null 2>&1 || mungekey --create --keyfile="$state/munge.key"
  chmod 400 "$state/munge.key"
  munged --force --key-file="$state/munge.key" --socket="$state/munge.socket" \
    --pid-file="$state/munged.pid" --log-file="$state/munged.log" --seed-file="$state/munged.seed"
  host="$(hostname -s)"
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  port="${RANKMESH_SLURM_PORT:-16817}"
  cat > "$conf" <<CONF
ClusterName=rankmesh
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$state/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  SLURM_CONF="$conf" slurmctld -f "$conf"
  SLURM_CONF="$conf" slurmd -f "$conf"
  for _ in $(seq 100); do
    if SLURM_CONF="$conf" sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "export SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.2
  done
  echo "local-slurm: the node did not come up; logs in $state" >&2
  tail -n 20 "$state"/*.log >&2 || true
  return 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  check) check ;;
  *) echo "usage: $0 start|stop|check" >&2; exit 2 ;;
esac
