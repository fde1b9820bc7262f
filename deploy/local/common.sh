# Shared helpers for the local server scripts (sourced, not run).
# shellcheck shell=bash

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../versions.env
source "$REPO_ROOT/deploy/versions.env"

# Downloads survive clean clones on the same machine; run-time data lives in the work tree and is git-ignored.
CACHE_DIR="${PIPELINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eos-pipeline}"
RUN_DIR="${PIPELINE_RUN_DIR:-$REPO_ROOT/.run}"

die() {
  echo "error: $*" >&2
  exit 1
}

info() {
  echo "[$(date +%H:%M:%S)] $*" >&2
}

require_command() {
  local cmd="$1" hint="$2"
  command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' not found on PATH. $hint"
}

require_java() {
  require_command java "Install a JDK 17 or newer (Debian: apt-get install openjdk-17-jdk-headless)."
  local major
  major=$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')
  [[ "${major%%.*}" -ge 17 ]] || die "Java $major found; Kafka $KAFKA_VERSION needs Java 17 or newer."
}

require_maven() {
  require_command mvn "Install Maven (Debian: apt-get install maven); it resolves the broker from Maven Central."
}

port_is_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pid_is_alive() {
  [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# Resolves the runtime classpath of a Maven pom into $2 once; later calls reuse it.
resolve_maven_classpath() {
  local pom="$1" out="$2"
  shift 2
  [[ -f "$out/.complete" ]] && return 0
  require_maven
  info "resolving $(basename "$(dirname "$pom")") dependencies from Maven Central into $out"
  rm -rf "$out"
  mkdir -p "$out"
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out" "$@" \
    || die "Maven could not resolve $pom (is Maven Central reachable?)"
  touch "$out/.complete"
}
