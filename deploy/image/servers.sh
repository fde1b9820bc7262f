#!/usr/bin/env bash
# The servers the tests start through testcontainers, as images built here with podman on the project's base image
# (deploy/image/base.sh), from Debian's packages and Maven Central only: no image registry.
#
#   deploy/image/servers.sh [kafka|postgres]...    default: both; prints nothing, logs to stderr
#
# Images: $EOS_KAFKA_IMAGE (default localhost/eos-pipeline-kafka:$KAFKA_VERSION of deploy/versions.env), a single-node
# KRaft broker from the jars deploy/local/kafka.sh resolves (deploy/image/kafka/); $EOS_POSTGRES_IMAGE (default
# localhost/eos-pipeline-postgres:15), Debian's PostgreSQL 15 (deploy/image/postgres/). Like build.sh, a build whose
# inputs (files, jars, base image) are unchanged is skipped: a warm run only computes their digest.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=deploy/local/common.sh
source "$HERE/../local/common.sh"

export EOS_BASE_IMAGE="${EOS_BASE_IMAGE:-localhost/eos-pipeline-base:bookworm}"
KAFKA_IMAGE="${EOS_KAFKA_IMAGE:-localhost/eos-pipeline-kafka:$KAFKA_VERSION}"
POSTGRES_IMAGE="${EOS_POSTGRES_IMAGE:-localhost/eos-pipeline-postgres:15}"
KAFKA_LIBS="$CACHE_DIR/kafka-$KAFKA_VERSION/libs"
PROJECT_LABEL="org.opencontainers.image.title=eos-pipeline"  # set by both Containerfiles

# The build context of an image: its directory; for Kafka, /opt/kafka laid out as one COPY (with vfs every layer is a
# full copy of the file system): the broker's jars, its settings, the local broker's log settings and start.sh.
assemble_context() {
  local name="$1" dir="$2" src="$REPO_ROOT/deploy/image/$1"
  if [[ "$name" == postgres ]]; then
    cp "$src/Containerfile" "$src/start.sh" "$dir/"
    return 0
  fi
  resolve_maven_classpath "$REPO_ROOT/deploy/local/kafka/pom.xml" "$KAFKA_LIBS" -Dkafka.version="$KAFKA_VERSION" \
    -Dscala.binary.version="$SCALA_BINARY_VERSION" -Dlog4j.version="$LOG4J_VERSION"
  mkdir -p "$dir/opt/kafka/libs" "$dir/opt/kafka/config"
  cp "$src/Containerfile" "$dir/"
  cp "$src/start.sh" "$dir/opt/kafka/"
  cp "$src/broker.properties" "$REPO_ROOT/deploy/local/kafka/log4j2.properties" "$dir/opt/kafka/config/"
  cp "$KAFKA_LIBS/"*.jar "$dir/opt/kafka/libs/"
}

# Everything in the context (names and contents) and the base image's id.
inputs_digest() {
  local dir="$1"
  {
    podman image inspect --format '{{.Id}}' "$EOS_BASE_IMAGE" 2>/dev/null || echo "$EOS_BASE_IMAGE"
    cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

build_image() {
  local name="$1" tag="$2" t0=$SECONDS context="$WORK/$1" digest
  mkdir "$context"
  assemble_context "$name" "$context"
  digest="$(inputs_digest "$context")"
  # With vfs even a fully cached build copies every layer: compare the inputs instead.
  if [[ "$(podman image inspect --format '{{index .Labels "eos.inputs"}}' "$tag" 2>/dev/null)" == "$digest" ]]; then
    info "$tag is up to date (inputs $digest)"
    return 0
  fi
  info "building $tag (deploy/image/$name/Containerfile, BASE_IMAGE=$EOS_BASE_IMAGE)"
  # --network host: apt reaches Debian's archive like the host does, without a bridge network.
  podman build --network host --pull="$PULL" --build-arg BASE_IMAGE="$EOS_BASE_IMAGE" --label "eos.inputs=$digest" \
    -t "$tag" -f "$context/Containerfile" "$context" >&2 || die "podman build of $tag failed"
  info "$tag built in $((SECONDS - t0))s, $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=si)B"
}

WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/eos-servers.XXXXXX")"
# shellcheck disable=SC2064
trap "rm -rf '$WORK'" EXIT
"$HERE/engine.sh" setup
PULL=missing  # a registry's base image is pulled once; the local one never is (no registry to ask)
if [[ "$EOS_BASE_IMAGE" == localhost/eos-pipeline-base:* ]]; then
  "$HERE/base.sh"
  PULL=never
fi
targets=("$@")
((${#targets[@]})) || targets=(kafka postgres)
for target in "${targets[@]}"; do
  case "$target" in
    kafka) build_image kafka "$KAFKA_IMAGE" ;;
    postgres) build_image postgres "$POSTGRES_IMAGE" ;;
    *) die "unknown image '$target' (kafka or postgres)" ;;
  esac
done
# The images these builds replaced (untagged now; full copies of their file systems with vfs).
podman image prune --force --filter "label=$PROJECT_LABEL" >/dev/null || info "podman image prune failed; ignored"
