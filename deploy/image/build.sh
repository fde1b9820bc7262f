#!/usr/bin/env bash
# `make image`: the service image and the compaction image, built with podman on a base built here from Debian's
# packages (no image registry needed).
#
#   deploy/image/build.sh [service|compaction]...    default: both
#
# Images: $EOS_IMAGE (default localhost/eos-pipeline:local) and $EOS_COMPACTION_IMAGE (default
# localhost/eos-pipeline-compaction:local), the names docker-compose.yml uses. EOS_BASE_IMAGE=python:3.11-slim (or any
# Debian bookworm image with python3) builds on a registry's image instead of the local base.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=deploy/local/common.sh
source "$HERE/../local/common.sh"

export EOS_BASE_IMAGE="${EOS_BASE_IMAGE:-localhost/eos-pipeline-base:bookworm}"
SERVICE_IMAGE="${EOS_IMAGE:-localhost/eos-pipeline:local}"
COMPACTION_IMAGE="${EOS_COMPACTION_IMAGE:-localhost/eos-pipeline-compaction:local}"
JARS_IMAGE="${COMPACTION_IMAGE%:*}-spark-jars:${COMPACTION_IMAGE##*:}"
PROJECT_LABEL="org.opencontainers.image.title=eos-pipeline"  # set by the Dockerfile's first stage

# Everything the Dockerfile reads (its context is cut down to these by .dockerignore), the base image and the target.
inputs_digest() {
  local target="$1"
  {
    echo "$target $(podman image inspect --format '{{.Id}}' "$EOS_BASE_IMAGE" 2>/dev/null || echo "$EOS_BASE_IMAGE")"
    cd "$REPO_ROOT"
    find Dockerfile .dockerignore pyproject.toml README.md requirements pipeline snapshots deploy/versions.env \
      deploy/local/spark/pom.xml -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

podman_build() {
  local target="$1" tag="$2"
  shift 2
  # --network host: RUN steps reach the registries like the host does, without a bridge network (CNI, iptables).
  podman build --network host --pull="$PULL" --build-arg BASE_IMAGE="$EOS_BASE_IMAGE" --target "$target" -t "$tag" "$@" \
    -f "$REPO_ROOT/Dockerfile" "$REPO_ROOT" >&2 || die "podman build of $tag (--target $target) failed"
}

build_image() {
  local target="$1" tag="$2" t0=$SECONDS digest
  digest="$(inputs_digest "$target")"
  # With vfs even a fully cached build copies every layer (a minute and more for the compaction image): skip it.
  if [[ "$(podman image inspect --format '{{index .Labels "eos.inputs"}}' "$tag" 2>/dev/null)" == "$digest" ]]; then
    info "$tag is up to date (inputs $digest)"
    return 0
  fi
  info "building $tag (Dockerfile --target $target, BASE_IMAGE=$EOS_BASE_IMAGE)"
  if [[ "$target" == compaction ]]; then
    # Tagged so that the pruning below keeps it: the compaction image copies the connector from this stage instead
    # of building on it, so nothing else would keep its cache alive.
    podman_build spark-jars "$JARS_IMAGE"
  fi
  podman_build "$target" "$tag" --label "eos.inputs=$digest"
  info "$tag built in $((SECONDS - t0))s, $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=si)B"
}

# Untagged images of this project's builds: the images a build replaced and the cache of inputs that changed. With
# vfs each holds full copies of its file system (gigabytes per rebuild); the cache of the current images stays.
prune() {
  podman image prune --force --filter "label=$PROJECT_LABEL" >/dev/null || info "podman image prune failed; ignored"
}

"$HERE/engine.sh" setup
PULL=missing  # a registry's base image is pulled once; the local one never is (no registry to ask)
if [[ "$EOS_BASE_IMAGE" == localhost/eos-pipeline-base:* ]]; then
  "$HERE/base.sh"
  PULL=never
fi
targets=("$@")
((${#targets[@]})) || targets=(service compaction)
for target in "${targets[@]}"; do
  case "$target" in
    service) build_image runtime "$SERVICE_IMAGE" ;;
    compaction) build_image compaction "$COMPACTION_IMAGE" ;;
    *) die "unknown image '$target' (service or compaction)" ;;
  esac
done
prune
