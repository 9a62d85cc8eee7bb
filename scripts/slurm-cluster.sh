#!/usr/bin/env bash
# A real single-node SLURM cluster for gridrun's tests and CI (Debian's slurm-wlm
# 22.05, as root, no systemd): munge, MariaDB + slurmdbd (sacct, hence submitit's
# job states, needs accounting), slurmctld, slurmd, and fake GPUs declared as GRES.
#
#   scripts/slurm-cluster.sh start    install what is missing, configure, start; idempotent
#   scripts/slurm-cluster.sh stop     stop the daemons this script started (by PID file)
#   scripts/slurm-cluster.sh status   exit 0 when the node answers idle/mixed/allocated
#
# Env: FAKE_GPUS=2 (0 = none). Adapted from ../shared/recipes/slurm-single-node.sh.
# Quirks met on the way, kept here so nobody meets them again:
# - no systemd: munged, mariadb and the slurm daemons are started by hand and
#   stopped by their PID files;
# - a requeued job waits `cred_expire` seconds before it may start again
#   (default 120 s), hence AuthInfo=cred_expire=10 for fast requeue tests;
# - SLURM sets CUDA_VISIBLE_DEVICES for a GRES only when its File= is a
#   character device: the fake GPUs are nodes of /dev/null's major/minor;
# - KillWait=5: a cancelled or requeued job's processes get SIGTERM, then
#   SIGKILL 5 s later (the default 30 s makes the tests slow).
set -euo pipefail
FAKE_GPUS=${FAKE_GPUS:-2}
H=$(hostname -s)
PIDS="/run/slurm/slurmd.pid /run/slurm/slurmctld.pid /run/slurm/slurmdbd.pid"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() { # seconds, command...
  local n=$(( $1 * 10 )); shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "slurm-cluster: timed out waiting for: $*" >&2; return 1
}
node_up() { sinfo -h -n "$H" -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; }

stop() {
  for p in $PIDS; do
    if alive "$p"; then kill "$(cat "$p")"; echo "stopped $(basename "$p" .pid)"; fi
  done
  if [ -x /etc/init.d/mariadb ] && [ -s /run/mysqld/mysqld.pid ]; then
    /etc/init.d/mariadb stop >/dev/null && echo "stopped mariadb" || true
  fi
  if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; echo "stopped munged"; fi
}

start() {
  # ---- packages ------------------------------------------------------------
  local pkgs="slurmctld slurmd slurm-client slurmdbd munge mariadb-server" missing
  missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi

  # ---- munge -----------------------------------------------------------------
  [ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
  wait_for 10 bash -c 'munge -n | unmunge'

  # ---- slurm.conf ----------------------------------------------------------------
  getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
  local cpus mem gres_node="" gres_types=""
  cpus=$(nproc)
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  if [ "$FAKE_GPUS" -gt 0 ]; then
    for i in $(seq 0 $((FAKE_GPUS - 1))); do
      [ -e /dev/fakegpu$i ] || mknod /dev/fakegpu$i c 1 3
    done
    gres_types="GresTypes=gpu"; gres_node="Gres=gpu:$FAKE_GPUS"
    printf 'AutoDetect=off\nNodeName=%s Name=gpu File=/dev/fakegpu[0-%d]\n' "$H" $((FAKE_GPUS - 1)) \
      > /etc/slurm/gres.conf
  else
    rm -f /etc/slurm/gres.conf
  fi
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
$gres_types
NodeName=$H NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem $gres_node State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
CONF

  # ---- accounting: MariaDB + slurmdbd --------------------------------------------
  alive /run/mysqld/mysqld.pid || /etc/init.d/mariadb start >/dev/null
  wait_for 30 mysqladmin ping
  mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=$H
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
CONF
  chmod 600 /etc/slurm/slurmdbd.conf
  alive /run/slurm/slurmdbd.pid || slurmdbd
  wait_for 30 bash -c '</dev/tcp/127.0.0.1/6819'
  sacctmgr -n -P show cluster format=cluster | grep -qx ci || sacctmgr -i add cluster ci >/dev/null

  # ---- slurmctld + slurmd ------------------------------------------------------------
  if alive /run/slurm/slurmctld.pid; then scontrol reconfigure; else slurmctld; fi
  alive /run/slurm/slurmd.pid || slurmd
  wait_for 60 node_up
  sinfo
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) node_up ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
