#!/usr/bin/env bash
# Idempotent system packages for primectl's tests and the CPU demo stack.
# Debian 12 (bookworm), run as root. Runs `apt-get update` only when a needed
# package is missing. Usage: scripts/install-system.sh [--check]
#   --check   only report missing packages (exit 1 if any), install nothing.
set -euo pipefail

PACKAGES=(
  libibverbs1      # mooncake_master / transfer engine dlopen it, even on CPU
  openssh-server   # multi-host launcher tests (sshd on loopback)
  openssh-client
  etcd-server      # /usr/bin/etcd (3.4.x on bookworm); package "etcd" is transitional/absent
  etcd-client      # /usr/bin/etcdctl
  iproute2         # ip (netns / link set lo up)
  util-linux       # unshare
  systemd          # systemd-analyze verify (works without systemd as PID 1)
  systemd-container  # systemd-nspawn: test hosts with systemd as PID 1 (tests/integration/nspawnhosts.py)
  debootstrap      # their Debian root file system (scripts/make-rootfs.sh)
  slurm-wlm        # Slurm-target tests: slurmctld + slurmd (22.05 on bookworm), started by hand, stopped by pid
  slurm-client     # sbatch, srun, squeue, scancel, scontrol, sinfo
  munge            # munged: Slurm's authentication (the tests run their own, with a key of their own)
  haproxy          # the load balancer in front of frontend replicas (2.6 on bookworm)
  prometheus       # monitoring: Prometheus 2.42 and promtool
  prometheus-alertmanager   # Alertmanager 0.25 and amtool
  prometheus-node-exporter  # node_exporter 1.5 (InfiniBand and textfile collectors)
  curl
  ca-certificates
)

# Dynamo's file discovery (the demo's control plane) takes inotify instances in every frontend and worker, and
# the suite runs several demos at once (pytest-xdist): the kernel's default of 128 per user runs out, and a
# frontend dies with "Too many open files (os error 24)". Raise the limit (never lower it); --check leaves it.
INOTIFY_INSTANCES=1024
if [[ "${1:-}" != "--check" && $(id -u) -eq 0 ]] && (( $(cat /proc/sys/fs/inotify/max_user_instances) < INOTIFY_INSTANCES )); then
  echo "$INOTIFY_INSTANCES" > /proc/sys/fs/inotify/max_user_instances \
    && echo "install-system: fs.inotify.max_user_instances raised to $INOTIFY_INSTANCES" \
    || echo "install-system: could not raise fs.inotify.max_user_instances (demos running together may fail)" >&2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [[ "${1:-}" == "--check" ]]; then
  if ((${#missing[@]})); then echo "missing: ${missing[*]}"; exit 1; fi
  echo "all present"; exit 0
fi

if ((${#missing[@]} == 0)); then
  echo "install-system: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-system: must run as root (missing: ${missing[*]})" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-system: installing ${missing[*]}"
apt-get update -qq
# --no-install-recommends keeps the image small; policy-rc.d is honoured so
# sshd/etcd/munge/slurm are NOT started as services inside containers without systemd.
apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Debian's etcd-server ships a unit but we never rely on it: tests start etcd
# by hand with a temp data dir. Make sure no packaged instance holds :2379.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  systemctl disable --now etcd >/dev/null 2>&1 || true
  # the same for the packaged Prometheus, Alertmanager and node_exporter (primectl runs its own, by pid)
  systemctl disable --now prometheus prometheus-alertmanager prometheus-node-exporter >/dev/null 2>&1 || true
fi
echo "install-system: done"
