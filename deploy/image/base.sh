#!/usr/bin/env bash
# A bare Debian bookworm base image built here from Debian's packages, for machines that reach Debian's archive but no
# image registry: mmdebstrap -> podman import. Python 3.11 (bookworm's python3) with venv, nothing else of the project.
#
#   deploy/image/base.sh [--force]    builds $EOS_BASE_IMAGE (default localhost/eos-pipeline-base:bookworm) unless it
#                                     exists; --force rebuilds it
#
# The image carries this host's package configuration, so that builds and installs inside reach the same registries:
# Debian sources (only those of the Debian archive for bookworm; EOS_APT_SOURCES=FILE... overrides), apt settings that
# are plain Acquire:: options (EOS_APT_CONF=FILE... overrides), the local CAs of /usr/local/share/ca-certificates
# (EOS_CA_CERTS=FILE... adds more; Java's trust store is built from them when a JRE is installed), /etc/pip.conf and
# pip's network settings from PIP_* variables. Credentials are never carried: no auth.conf, no Maven settings. The
# image is for local builds; don't push it anywhere.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../local/common.sh"

BASE_IMAGE="${EOS_BASE_IMAGE:-localhost/eos-pipeline-base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates

# The host's sources for the Debian archive of $SUITE: a third-party source would need its keyring inside too.
host_apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    grep -Eq "(^|[[:space:]])$SUITE(-updates|-security|-backports)?([[:space:]]|$)" "$f" || continue
    if grep -Eiq 'signed-by' "$f" && grep -Ei 'signed-by' "$f" | grep -vq 'debian-archive-keyring'; then
      continue
    fi
    echo "$f"
  done
}

# apt.conf.d files that only set Acquire:: options (proxies, snapshot validity, timeouts): hooks such as packagekit's
# call programs the image does not have.
host_apt_conf() {
  local f
  for f in /etc/apt/apt.conf.d/*; do
    [[ -f "$f" ]] || continue
    grep -Ev '^[[:space:]]*(//|#|$)' "$f" | grep -Evq '^[[:space:]]*Acquire::' && continue
    grep -Eq '^[[:space:]]*Acquire::' "$f" && echo "$f"
  done
}

host_ca_certs() {
  local f
  for f in /usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt; do
    [[ -f "$f" ]] && echo "$f"
  done
}

# pip's own network settings from PIP_* variables (not FIND_LINKS or other local paths of this host), as image ENV.
pip_env_changes() {
  local name key
  for name in INDEX_URL EXTRA_INDEX_URL TRUSTED_HOST CERT DEFAULT_TIMEOUT RETRIES PROXY; do
    key="PIP_$name"
    [[ -n "${!key:-}" ]] && echo "--change=ENV $key=${!key}"
  done
  return 0
}

build() {
  require_command podman "Run deploy/image/engine.sh setup (installs podman from Debian packages)."
  require_command mmdebstrap "Run deploy/image/engine.sh setup (installs mmdebstrap from Debian packages)."
  ((EUID == 0)) || die "building the base image needs root (mmdebstrap creates device nodes and chowns files)"
  local sources=() conf=() certs=() f
  if [[ -n "${EOS_APT_SOURCES:-}" ]]; then read -r -a sources <<<"$EOS_APT_SOURCES"; else mapfile -t sources < <(host_apt_sources); fi
  if [[ -n "${EOS_APT_CONF:-}" ]]; then read -r -a conf <<<"$EOS_APT_CONF"; else mapfile -t conf < <(host_apt_conf); fi
  mapfile -t certs < <(host_ca_certs)
  if [[ -n "${EOS_CA_CERTS:-}" ]]; then read -r -a f <<<"$EOS_CA_CERTS"; certs+=("${f[@]}"); fi
  ((${#sources[@]})) || sources=("http://deb.debian.org/debian")
  for f in "${sources[@]}" "${conf[@]}" "${certs[@]}"; do [[ -f "$f" || "$f" == *://* ]] || die "no such file: $f"; done

  local work
  work=$(mktemp -d "${TMPDIR:-/var/tmp}/eos-base.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  mkdir -p "$work/ca"
  ((${#certs[@]})) && cp "${certs[@]}" "$work/ca/"
  if [[ -f /etc/pip.conf ]]; then cp /etc/pip.conf "$work/pip.conf"; else : >"$work/pip.conf"; fi

  local aptopts=() c
  for c in "${conf[@]}"; do aptopts+=(--aptopt="$c"); done
  info "building $BASE_IMAGE with mmdebstrap ($SUITE: $PACKAGES) from ${sources[*]}"
  local t0=$SECONDS
  # The local CAs go in before ca-certificates is configured, so its update-ca-certificates run includes them.
  # shellcheck disable=SC2016  # "$1" is the hooks' argument (the new root), expanded by mmdebstrap's shell
  mmdebstrap --variant=required --include="$PACKAGES" --format=tar "${aptopts[@]}" \
    --setup-hook="mkdir -p \"\$1/usr/local/share/ca-certificates\" && cp -r '$work/ca/.' \"\$1/usr/local/share/ca-certificates/\"" \
    --customize-hook="[ -s '$work/pip.conf' ] && cp '$work/pip.conf' \"\$1/etc/pip.conf\" || true" \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"; rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$SUITE" "$work/rootfs.tar" "${sources[@]}" </dev/null >"$work/mmdebstrap.log" 2>&1 \
    || { tail -n 30 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed (is Debian's archive reachable?)"; }
  local changes=() previous
  mapfile -t changes < <(pip_env_changes)
  previous="$(podman image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || true)"
  podman import -q --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "${changes[@]}" "$work/rootfs.tar" "$BASE_IMAGE" \
    >/dev/null \
    || die "podman import failed"
  # The image replaced by --force: untagged now, and a full copy with vfs.
  [[ -z "$previous" ]] || podman image rm "$previous" >/dev/null 2>&1 || true
  info "$BASE_IMAGE built in $((SECONDS - t0))s ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") bytes)"
}

case "${1:-}" in
  --force) build ;;
  "")
    if command -v podman >/dev/null 2>&1 && podman image exists "$BASE_IMAGE"; then
      info "$BASE_IMAGE exists (--force rebuilds it)"
    else
      build
    fi
    ;;
  *)
    echo "usage: $0 [--force]" >&2
    exit 2
    ;;
esac
