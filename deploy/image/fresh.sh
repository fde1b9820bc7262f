#!/usr/bin/env bash
# "A truly fresh machine": README's `make demo` from a clean clone, in a container of the bare Debian base image
# (deploy/image/base.sh) that has no JDK, Maven, PostgreSQL, virtualenv or Kafka, so that deploy/local/setup.sh must
# install each of them. Then the PostgreSQL that setup installed is started and stopped with deploy/local/postgres.sh.
#
#   deploy/image/fresh.sh [GIT-REF]    default HEAD: what is committed, as a clone would get it
#
# The container has its own network namespace (slirp4netns): its Kafka (9092/9093), PostgreSQL (55432) and metrics
# ports (9464/9465) do not collide with servers on this machine, and it reaches the registries through the host's
# package configuration carried into the base image. The repository is mounted read-only and cloned inside.
# Log: $EOS_FRESH_LOG (default $RUN_DIR/image/fresh-demo.log); exit status: the demo's (0 = the checker's clean verdict).
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=deploy/local/common.sh
source "$HERE/../local/common.sh"

BASE_IMAGE="${EOS_BASE_IMAGE:-localhost/eos-pipeline-base:bookworm}"
REF="${1:-HEAD}"
LOG="${EOS_FRESH_LOG:-$RUN_DIR/image/fresh-demo.log}"
CONTAINER="eos-fresh-demo-$$"

git -C "$REPO_ROOT" rev-parse --verify -q "$REF^{commit}" >/dev/null || die "no commit $REF in $REPO_ROOT"
COMMIT="$(git -C "$REPO_ROOT" rev-parse "$REF^{commit}")"
"$HERE/engine.sh" setup
"$HERE/base.sh"
"$HERE/engine.sh" check "$BASE_IMAGE"
mkdir -p "$(dirname "$LOG")"

# What a person on a fresh Debian machine has done before README's commands: installed git and make, cloned (into
# /srv: postgres.sh runs the server as user postgres, who cannot enter root's home).
# shellcheck disable=SC2016
inside='
set -euo pipefail
phase() { echo "=== [$(date +%H:%M:%S)] $* (${SECONDS}s)"; }
phase "installing git and make"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends git make >/dev/null
for tool in java mvn psql; do ! command -v $tool >/dev/null || { echo "not fresh: $tool is installed"; exit 3; }; done
phase "cloning"
git clone -q --no-checkout /origin /srv/eos-pipeline
cd /srv/eos-pipeline
git checkout -q "$COMMIT"
phase "make demo"
make demo
phase "PostgreSQL from the packages setup installed"
! compgen -G "/etc/postgresql/*/main" >/dev/null || { echo "setup left a main cluster on port 5432"; exit 4; }
deploy/local/postgres.sh start
deploy/local/postgres.sh status
deploy/local/postgres.sh stop
phase "done"
'
info "make demo in a fresh container of $BASE_IMAGE at ${COMMIT:0:12} (log: $LOG)"
t0=$SECONDS
trap 'podman rm --force --ignore "$CONTAINER" >/dev/null 2>&1 || true' EXIT
status=0
podman run --rm --name "$CONTAINER" --network slirp4netns --env COMMIT="$COMMIT" \
  --volume "$REPO_ROOT:/origin:ro" "$BASE_IMAGE" bash -c "$inside" </dev/null >"$LOG" 2>&1 || status=$?
grep '^=== ' "$LOG" >&2 || true
if ((status != 0)); then
  tail -n 60 "$LOG" >&2
  die "the fresh-machine demo failed (exit $status) after $((SECONDS - t0))s; log: $LOG"
fi
info "the fresh-machine demo passed in $((SECONDS - t0))s"
