#!/usr/bin/env bash
# Build (once) the Debian bookworm root file system that the systemd-nspawn test hosts boot
# (tests/integration/nspawnhosts.py). Idempotent: the result is cached as a directory under the
# cache dir, keyed by a hash of the package list, this script and the suite, and reused while
# they are unchanged. Hosts never write to it: each boots an overlay (or a copy) on top.
#
# Usage: scripts/make-rootfs.sh [--cache-dir DIR] [--force] [--check] [--prune]
#   --cache-dir DIR  where rootfs trees live (default $PRIMECTL_ROOTFS_CACHE or /var/cache/primectl/rootfs)
#   --force          rebuild even when a cached tree with this key exists
#   --check          only say whether the cached tree exists (exit 1 if not); build nothing
#   --prune          afterwards delete the cache's other trees (older package lists or script versions;
#                    only when no test is booting them)
# Prints progress on stderr and the root file system's path alone on stdout, so
#   ROOT=$(scripts/make-rootfs.sh)
# works. Needs root, debootstrap and the Debian mirror apt already uses (override: ROOTFS_MIRROR).
set -euo pipefail

SUITE=bookworm
PACKAGES=(
  systemd systemd-sysv dbus libpam-systemd  # systemd as PID 1, logind for ssh sessions
  openssh-server                           # how primectl reaches a host
  python3                                  # primectl's host agent runs as `python3 -I -S`
  python3-venv                             # `primectl provision` creates the runtime venv on the host
  iproute2 procps                          # ip, ps/pgrep/kill: what an operator (and the tests) use
  curl                                     # probes from inside a host; brings libcurl4 (Mooncake links it)
  libibverbs1 libnuma1                     # Mooncake's engine.so/store.so link them, even on CPU
  libgomp1 libhwloc15                      # NIXL/UCX plugins in the runtime venv link them
  etcd-server                              # /usr/bin/etcd, as primectl's etcd service expects (unit disabled)
  haproxy                                  # /usr/sbin/haproxy for frontend.replicas > 1 (unit disabled)
)

cache_dir=${PRIMECTL_ROOTFS_CACHE:-/var/cache/primectl/rootfs}
force=0
check=0
prune=0
while (($#)); do
  case "$1" in
    --cache-dir) cache_dir=$2; shift 2 ;;
    --force) force=1; shift ;;
    --check) check=1; shift ;;
    --prune) prune=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "make-rootfs: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { echo "make-rootfs: $*" >&2; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
start=$(date +%s.%N)

prune_others() {
  ((prune)) || return 0
  local other
  for other in "$cache_dir/$SUITE"-*; do
    [[ -d "$other" && "$other" != "$root" ]] || continue
    log "pruning $other"
    rm -rf "$other"
  done
}

# The mirror apt already uses (deb822 sources first, then sources.list), unless overridden.
apt_mirror() {
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [[ -z "$uri" ]]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
      /etc/apt/sources.list 2>/dev/null || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

key=$( { printf '%s\n' "$SUITE" "$(dpkg --print-architecture 2>/dev/null || uname -m)" "${PACKAGES[@]}"; cat "$0"; } \
       | sha256sum | cut -c1-16)
root="$cache_dir/$SUITE-$key"

if [[ -f "$root/.primectl-rootfs" && $force -eq 0 ]]; then
  log "reused cached $root (built $(cat "$root/.primectl-rootfs")) in $(secs "$start" "$(date +%s.%N)") s"
  prune_others
  echo "$root"
  exit 0
fi
if ((check)); then log "no cached rootfs at $root"; exit 1; fi
if [[ $(id -u) -ne 0 ]]; then log "must run as root"; exit 1; fi
if ! command -v debootstrap >/dev/null; then
  log "debootstrap is missing: run scripts/install-system.sh"; exit 1
fi

mkdir -p "$cache_dir"
exec 9>"$cache_dir/.lock"
flock 9  # one build at a time; a second caller waits and then reuses the first one's tree
if [[ -f "$root/.primectl-rootfs" && $force -eq 0 ]]; then
  log "reused $root (built by a concurrent run)"
  echo "$root"
  exit 0
fi

mirror=${ROOTFS_MIRROR:-$(apt_mirror)}
work="$root.tmp.$$"
rm -rf "$work"
trap 'rm -rf "$work"' EXIT
include=$(IFS=,; echo "${PACKAGES[*]}")
log "debootstrap --variant=minbase $SUITE from $mirror (packages: $include)"
mkdir -p "$cache_dir/debs"
if ! debootstrap --variant=minbase --components=main --include="$include" --cache-dir="$cache_dir/debs" \
     "$SUITE" "$work" "$mirror" >"$cache_dir/debootstrap.log" 2>&1; then
  tail -n 30 "$cache_dir/debootstrap.log" >&2
  log "debootstrap failed (full log: $cache_dir/debootstrap.log)"
  exit 1
fi
boot=$(date +%s.%N)

# What every test host gets in common; per-host identity (hostname, machine-id, ssh host key,
# authorised key, address) is written by nspawnhosts.py into each host's own layer.
rm -f "$work"/etc/ssh/ssh_host_*                  # no host key shared by every host
: >"$work/etc/machine-id"                         # each host writes its own
rm -f "$work/var/lib/dbus/machine-id"
echo "localhost" >"$work/etc/hostname"
systemctl --root="$work" disable etcd.service >/dev/null 2>&1 || true   # primectl starts its own etcd
systemctl --root="$work" disable haproxy.service >/dev/null 2>&1 || true   # and its own balancer
systemctl --root="$work" enable systemd-networkd.service >/dev/null 2>&1  # static address per host (host0)
cat >"$work/etc/ssh/sshd_config.d/10-primectl-test.conf" <<'EOF'
# primectl test host: key-only root login; room for primectl's parallel sessions.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 200:30:400
MaxSessions 50
EOF
rm -rf "$work"/var/cache/apt/archives/*.deb "$work"/var/lib/apt/lists/* "$work"/usr/share/doc/* \
       "$work"/usr/share/man/* "$work"/usr/share/locale/*
date -u +%Y-%m-%dT%H:%M:%SZ >"$work/.primectl-rootfs"

rm -rf "$root"
mv "$work" "$root"
trap - EXIT
end=$(date +%s.%N)
log "built $root ($(du -sh "$root" | cut -f1)) in $(secs "$start" "$end") s (debootstrap $(secs "$start" "$boot") s)"
prune_others
echo "$root"
