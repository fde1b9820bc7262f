#!/usr/bin/env bash
# A container engine for building and running the images on a Debian machine without Docker: podman from Debian's
# packages, configured for machines where crun cannot manage cgroups and the default ulimits are not permitted.
#
#   deploy/image/engine.sh setup    installs podman runc mmdebstrap uidmap slirp4netns when missing (root), and writes
#                                   containers.conf + storage.conf when none exist (/etc/containers as root,
#                                   ~/.config/containers otherwise): storage on overlay where it mounts, else vfs
#   deploy/image/engine.sh check [IMAGE]
#                                   exit 0 when podman can run a container of IMAGE (default: the base image);
#                                   otherwise exit 1 with the reason on stderr (the image tests skip with it)
#
# Called by `make image` and by the image tests, never by `make setup`: not everybody wants podman installed.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../local/common.sh"

PACKAGES=(podman runc mmdebstrap uidmap slirp4netns)
BASE_IMAGE="${EOS_BASE_IMAGE:-localhost/eos-pipeline-base:bookworm}"

if ((EUID == 0)); then
  CONFIG_DIR=/etc/containers
else
  CONFIG_DIR="${XDG_CONFIG_HOME:-$HOME/.config}/containers"
fi

install_packages() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get here: install podman yourself"
  ((EUID == 0)) || die "need root (or sudo) to install: ${missing[*]}"
  info "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 \
    || die "apt-get install ${missing[*]} failed"
}

# runc: crun cannot set up cgroups on these machines. cgroupfs: no systemd to delegate cgroups to.
# default_ulimits = []: the engine's default nofile/nproc limits are refused here ("operation not permitted").
write_containers_conf() {
  local file="$CONFIG_DIR/containers.conf"
  [[ -e "$file" ]] && return 0
  mkdir -p "$CONFIG_DIR"
  info "writing $file (runc, cgroupfs, no default ulimits)"
  cat >"$file" <<'EOF'
# Written by deploy/image/engine.sh (eos-pipeline); delete it to get podman's defaults back.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
}

# The storage driver: overlay where this machine can mount one (root only: a rootless overlay needs kernel support
# that nested or sandboxed machines may not give), vfs otherwise; EOS_PODMAN_STORAGE_DRIVER chooses one instead.
# vfs works on any file system but copies the whole file system for every build step and every container: measured
# here, `podman run` of the 300 MB service image took 11-15 s with vfs against 0.2-0.3 s with overlay, and CI's image
# tests (~8 container starts, two image builds) spent most of their 38 minutes copying.
# overlay gets a graph root of its own: podman refuses to open a store that another driver initialised.
VFS_GRAPHROOT=/var/lib/containers/storage
OVERLAY_GRAPHROOT=/var/lib/containers/storage-overlay
OURS="# Written by deploy/image/engine.sh (eos-pipeline); delete it to get podman's defaults back."

overlay_mounts() {
  ((EUID == 0)) || return 1
  local dir status=1
  mkdir -p "$(dirname "$OVERLAY_GRAPHROOT")"
  dir=$(mktemp -d "$(dirname "$OVERLAY_GRAPHROOT")/.overlay-probe.XXXXXX")  # the file system the store will use
  mkdir "$dir/lower" "$dir/upper" "$dir/work" "$dir/merged"
  if mount -t overlay overlay -o "lowerdir=$dir/lower,upperdir=$dir/upper,workdir=$dir/work" "$dir/merged" \
    2>/dev/null; then
    umount "$dir/merged" && status=0
  fi
  rm -rf "$dir"
  return $status
}

storage_driver() {
  if [[ -n "${EOS_PODMAN_STORAGE_DRIVER:-}" ]]; then
    echo "$EOS_PODMAN_STORAGE_DRIVER"
  elif overlay_mounts; then
    echo overlay
  else
    echo vfs
  fi
}

# A storage.conf of ours that chose vfs (every one before overlay was probed) moves on to overlay once this machine
# mounts one; the vfs store stays where it was (delete $VFS_GRAPHROOT to get its disk space back). Anybody else's
# storage.conf is left alone.
write_storage_conf() {
  local file="$CONFIG_DIR/storage.conf" driver graphroot=$VFS_GRAPHROOT runroot=/run/containers/storage
  driver=$(storage_driver)
  if [[ "$driver" == overlay ]]; then
    graphroot=$OVERLAY_GRAPHROOT runroot=/run/containers/storage-overlay
  fi
  if [[ -e "$file" ]]; then
    head -1 "$file" | grep -qxF "$OURS" && grep -qx 'driver = "vfs"' "$file" && [[ "$driver" == overlay ]] \
      || return 0
    info "overlay mounts work here: $file moves from vfs to overlay (the vfs store stays in $VFS_GRAPHROOT)"
  fi
  mkdir -p "$CONFIG_DIR"
  info "writing $file (driver $driver)"
  {
    echo "$OURS"
    echo "[storage]"
    echo "driver = \"$driver\""
    if ((EUID == 0)); then
      echo "runroot = \"$runroot\""
      echo "graphroot = \"$graphroot\""
    fi
  } >"$file"
}

setup() {
  install_packages
  write_containers_conf
  write_storage_conf
  local out
  out=$(podman info --format '{{.Store.GraphDriverName}} {{.Host.OCIRuntime.Name}}' 2>&1) \
    || die "podman does not start: $out"
  info "podman ready (storage driver, runtime: $out)"
}

check() {
  local image="${1:-$BASE_IMAGE}" out
  command -v podman >/dev/null 2>&1 || die "podman is not installed (deploy/image/engine.sh setup installs it)"
  out=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1) || die "podman does not start: ${out##*$'\n'}"
  podman image exists "$image" || die "image $image is not built (make image builds it)"
  out=$(podman run --rm --network host "$image" true 2>&1) || die "podman cannot run a container of $image: ${out##*$'\n'}"
}

case "${1:-}" in
  setup) setup ;;
  check) check "${2:-}" ;;
  *)
    echo "usage: $0 setup|check [IMAGE]" >&2
    exit 2
    ;;
esac
