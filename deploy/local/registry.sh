#!/usr/bin/env bash
# A real Schema Registry on loopback without Docker: Apicurio Registry (deploy/versions.env), whose
# Confluent-compatible API (/apis/ccompat/v7) confluent-kafka's SchemaRegistryClient and serdes talk to.
#
#   deploy/local/registry.sh build|start|stop [--wipe]|status|url|pid|logs [N]|pause|resume
#
# build   assembles the registry from Maven Central once (deploy/local/registry/pom.xml; ~1.5 min cold, then cached
#         under the cache dir with the jars in the Maven repository): `make setup` runs it.
# start   builds if needed, starts it on 127.0.0.1:$REGISTRY_PORT (default 18081) with -Xmx256m, waits until
#         GET /apis/ccompat/v7/subjects answers, and sets the global compatibility to BACKWARD (Apicurio's default is
#         NONE). Idempotent; a registry already answering on the port that this script did not start is used as is.
# url     prints the URL clients are given (schema.registry.url): http://127.0.0.1:18081/apis/ccompat/v7
# pid     prints the pid of the registry's java process (this script's, else the one listening on the port)
# pause / resume   SIGSTOP / SIGCONT that process (fault tests).
#
# Storage: Apicurio 2.4's in-memory storage is an in-memory H2 database, lost on restart. Given a file instead
# (REGISTRY_DATASOURCE_URL, a run-time setting), the same H2 keeps the schemas and rules under the run dir across
# restarts, with no other artifact: `stop --wipe` starts over, REGISTRY_STORAGE=memory keeps nothing. The PostgreSQL
# and KafkaSQL variants were not used: the database kind is fixed when Quarkus builds the app (another build with
# another JDBC driver), Maven Central has no apicurio-registry-storage-sql artifact, and either would tie this
# registry to another server's life (postgres.sh, the broker) in tests that pause and restart those.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PORT="${REGISTRY_PORT:-18081}"
URL="http://127.0.0.1:$PORT/apis/ccompat/v7"
READY_TIMEOUT_S="${REGISTRY_READY_TIMEOUT_S:-120}"
COMPATIBILITY="${REGISTRY_COMPATIBILITY:-BACKWARD}"
STORAGE="${REGISTRY_STORAGE:-file}"
HEAP="${REGISTRY_HEAP_OPTS:--Xmx256m}"
MODULE="$REPO_ROOT/deploy/local/registry"
MAVEN_SETTINGS="${REGISTRY_MAVEN_SETTINGS:-$MODULE/settings.xml}"
DIR="$RUN_DIR/registry"
PID_FILE="$DIR/registry.pid"
LOG="$DIR/registry.log"

# The build is keyed on the versions and on the module's own files, so that a change to either builds anew.
build_dir() {
  local key
  key=$(cat "$MODULE/pom.xml" "$MODULE/settings.xml" | sha256sum | cut -c1-10)
  echo "$CACHE_DIR/apicurio-registry-$APICURIO_REGISTRY_VERSION-quarkus-$APICURIO_QUARKUS_VERSION-$key"
}
BUILD="$(build_dir)"

runner_jar() {
  compgen -G "$BUILD/target/*-runner.jar" | head -n 1
}

build() {
  [[ -f "$BUILD/.complete" ]] && return 0
  require_java
  require_maven
  info "building Apicurio Registry $APICURIO_REGISTRY_VERSION from Maven Central into $BUILD (~1.5 min the first time)"
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  # The app jar is unpacked into the module's classes (pom.xml), so Quarkus must not also load it from the class path.
  mvn -B -Dstyle.color=never -s "$MAVEN_SETTINGS" -f "$MODULE/pom.xml" package \
    -Dapicurio.version="$APICURIO_REGISTRY_VERSION" -Dquarkus.version="$APICURIO_QUARKUS_VERSION" \
    -Dregistry.build.directory="$BUILD/target" \
    -Dquarkus.class-loading.removed-artifacts=io.apicurio:apicurio-registry-app >"$BUILD/build.log" 2>&1 \
    || { tail -n 40 "$BUILD/build.log" >&2; die "building the registry failed (log: $BUILD/build.log; is Maven Central reachable?)"; }
  [[ -n "$(runner_jar)" ]] || die "the registry build made no runner jar (log: $BUILD/build.log)"
  touch "$BUILD/.complete"
  info "registry built: $(runner_jar)"
}

answers() {
  curl -sf -m 5 -o /dev/null "$URL/subjects"
}

# The pid of whatever listens on the port (a registry this script did not start), empty if none is found.
listener_pid() {
  ss -ltnpH "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2
}

registry_pid() {
  if pid_is_alive "$PID_FILE"; then cat "$PID_FILE"; else listener_pid; fi
}

datasource_url() {
  case "$STORAGE" in
    # WRITE_DELAY=0: a schema whose id was handed out is on disk, also when the registry is then killed.
    file) echo "jdbc:h2:file:$DIR/data/registry;WRITE_DELAY=0" ;;
    memory) echo "jdbc:h2:mem:registry_db" ;;
    *) die "REGISTRY_STORAGE must be file or memory, not '$STORAGE'" ;;
  esac
}

launch() {
  mkdir -p "$DIR/data"
  : >"$LOG"  # a restarted registry must not be judged by its previous run's lines
  # QUARKUS_HTTP_HOST: without it Quarkus listens on every interface. The global rule set here applies from the first
  # request (the ccompat /config endpoint still reports NONE until it is set through the API, done below).
  # shellcheck disable=SC2086
  QUARKUS_HTTP_HOST=127.0.0.1 HTTP_PORT="$PORT" REGISTRY_DATASOURCE_URL="$(datasource_url)" \
    REGISTRY_RULES_GLOBAL_COMPATIBILITY="$COMPATIBILITY" \
    nohup java $HEAP -XX:+UseSerialGC -Djava.awt.headless=true -jar "$(runner_jar)" >>"$LOG" 2>&1 &
  echo $! >"$PID_FILE"
}

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until answers; do
    if ! pid_is_alive "$PID_FILE"; then
      tail -n 40 "$LOG" >&2 || true
      die "the registry exited during start-up (log: $LOG)"
    fi
    if ((SECONDS > deadline)); then
      tail -n 40 "$LOG" >&2 || true
      die "the registry is not ready after ${READY_TIMEOUT_S}s (log: $LOG)"
    fi
    sleep 0.2
  done
}

set_compatibility() {
  curl -sf -m 10 -o /dev/null -X PUT -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    -d "{\"compatibility\": \"$COMPATIBILITY\"}" "$URL/config" \
    || die "setting the registry's global compatibility to $COMPATIBILITY failed ($URL/config)"
}

start() {
  require_command curl "Install curl (Debian: apt-get install curl)."
  if ! pid_is_alive "$PID_FILE" && answers; then
    info "a Schema Registry not started by this script answers on $URL (pid $(listener_pid)): using it"
    set_compatibility
    return 0
  fi
  build
  local t0=$SECONDS
  if ! pid_is_alive "$PID_FILE"; then
    port_is_open "$PORT" && die "port $PORT is taken by another process; stop it or set REGISTRY_PORT"
    launch
  fi
  wait_ready
  set_compatibility
  info "Schema Registry (Apicurio $APICURIO_REGISTRY_VERSION, $STORAGE storage) ready on $URL in $((SECONDS - t0))s"
}

stop() {
  local pid
  if pid_is_alive "$PID_FILE"; then
    pid="$(cat "$PID_FILE")"
    kill -CONT "$pid" 2>/dev/null || true  # a paused JVM does not act on SIGTERM
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS > deadline)); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.2
    done
  fi
  rm -f "$PID_FILE"
  [[ "${1:-}" == "--wipe" ]] && rm -rf "$DIR"
  info "Schema Registry stopped"
}

signal() {
  local pid
  pid="$(registry_pid)"
  [[ -n "$pid" ]] || die "no registry is running on port $PORT"
  kill "-$1" "$pid"
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop "${2:-}" ;;
  status)
    if pid_is_alive "$PID_FILE"; then echo "running (pid $(cat "$PID_FILE"), $URL)"
    elif answers; then echo "running (not started by this script: pid $(listener_pid), $URL)"
    else echo "stopped"; fi
    ;;
  url) echo "$URL" ;;
  pid)
    pid="$(registry_pid)"
    [[ -n "$pid" ]] || die "no registry is running on port $PORT"
    echo "$pid"
    ;;
  logs) tail -n "${2:-100}" "$LOG" ;;
  pause) signal STOP ;;
  resume) signal CONT ;;
  *)
    echo "usage: $0 build|start|stop [--wipe]|status|url|pid|logs [N]|pause|resume" >&2
    exit 2
    ;;
esac
