#!/usr/bin/env bash
# A real Apache Kafka broker on loopback without Docker, resolved from Maven Central.
#
#   deploy/local/kafka.sh [--cluster|--secure] start|stop|status|logs|bootstrap
#   deploy/local/kafka.sh --cluster kill|pause|resume|restart NODE
#   deploy/local/kafka.sh --secure credentials      # path of the file holding the users' passwords and the CA
#
# Single node: one KRaft broker+controller, clients on 127.0.0.1:9092.
# --cluster:   three KRaft broker+controllers, clients on 127.0.0.1:19092,19093,19094 (replication 3, min ISR 2).
# --secure:    one KRaft broker+controller with a SASL_SSL listener on 127.0.0.1:9192 (SCRAM-SHA-512 over TLS,
#              hostname verification on), the StandardAuthorizer with allow.everyone.if.no.acl.found=false, and
#              SCRAM users admin (super user), pipeline and compaction (deploy/local/kafka-secure.sh).
# Every command is idempotent: start on a running broker only checks that it is ready.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

KAFKA_LIBS="$CACHE_DIR/kafka-$KAFKA_VERSION/libs"
READY_TIMEOUT_S="${KAFKA_READY_TIMEOUT_S:-90}"
# One full `make test` leaves ~2,800 partitions behind (every test has topics of its own). At 512 MB a broker kept
# across runs (KEEP_KAFKA=1) ran out of heap near 14,000 partitions: long GC pauses first, which the tests saw as
# fetch stalls and undelivered records, then OutOfMemoryError. 1 GB leaves room for several runs; `stop --wipe`
# starts over.
HEAP="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"

MODE=single
if [[ "${1:-}" == "--cluster" || "${1:-}" == "--secure" ]]; then
  MODE="${1#--}"
  shift
fi

if [[ "$MODE" == secure ]]; then
  NODES=(1)
  client_port() { echo 9192; }
  controller_port() { echo 9193; }
  REPLICATION=1
  MIN_ISR=1
elif [[ "$MODE" == single ]]; then
  NODES=(1)
  client_port() { echo 9092; }
  controller_port() { echo 9093; }
  REPLICATION=1
  MIN_ISR=1
else
  NODES=(1 2 3)
  client_port() { echo $((19091 + $1)); }
  controller_port() { echo $((19191 + $1)); }
  REPLICATION=3
  MIN_ISR=2
fi
DIR="$RUN_DIR/kafka-$MODE"
# The cluster's nodes are killed and started again dozens of times a test run (49 broker JVMs in one CI run of
# 2026-11-29, 29 % of all the CPU the run used), and the secured broker several times: with the JVM's
# optimising compiler (C2) a start costs its work up front. Measured here, three nodes started and then left idle for a
# minute: 91 + 24 CPU-seconds with C2, 20 + 8 with the first-tier compiler alone, ready in 48 s against 22 s. The single
# node keeps the default: it runs once for a whole test run and carries the benchmarks (BENCHMARKS.md).
if [[ "$MODE" == single ]]; then
  JIT="${KAFKA_JIT_OPTS:-}"
else
  JIT="${KAFKA_JIT_OPTS:--XX:TieredStopAtLevel=1}"
fi
SECURE_DIR="$DIR/security"
# shellcheck source=kafka-secure.sh
source "$(dirname "${BASH_SOURCE[0]}")/kafka-secure.sh"

node_dir() { echo "$DIR/node-$1"; }
pid_file() { echo "$(node_dir "$1")/kafka.pid"; }
log_file() { echo "$(node_dir "$1")/server.log"; }

bootstrap_servers() {
  local out="" n
  for n in "${NODES[@]}"; do out+="${out:+,}127.0.0.1:$(client_port "$n")"; done
  echo "$out"
}

quorum_voters() {
  local out="" n
  for n in "${NODES[@]}"; do out+="${out:+,}$n@127.0.0.1:$(controller_port "$n")"; done
  echo "$out"
}

listener_config() {
  local n="$1"
  if [[ "$MODE" == secure ]]; then
    secure_listener_config "$(client_port "$n")" "$(controller_port "$n")"
    return
  fi
  cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$(client_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(client_port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
EOF
}

write_config() {
  local n="$1" dir
  dir="$(node_dir "$n")"
  mkdir -p "$dir/data"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(quorum_voters)
$(listener_config "$n")
log.dirs=$dir/data
num.network.threads=2
num.io.threads=4
num.partitions=1
default.replication.factor=$REPLICATION
min.insync.replicas=$MIN_ISR
auto.create.topics.enable=false
offsets.topic.num.partitions=10
offsets.topic.replication.factor=$REPLICATION
transaction.state.log.num.partitions=10
transaction.state.log.replication.factor=$REPLICATION
transaction.state.log.min.isr=$MIN_ISR
share.coordinator.state.topic.replication.factor=$REPLICATION
share.coordinator.state.topic.min.isr=$MIN_ISR
group.initial.rebalance.delay.ms=0
# Both group protocols, said explicitly (Kafka 4's default): GROUP_PROTOCOL=classic or consumer (KIP-848).
group.coordinator.rebalance.protocols=classic,consumer,streams
# KIP-848 groups take their session timeout and heartbeat interval from the broker: here the pipeline's own defaults
# (SESSION_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS), and minimums low enough for a group config of 6 s / 0.5 s (fault tests).
group.consumer.session.timeout.ms=10000
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
# Abort a zombie's timed-out transaction within a second of its timeout instead of ten.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
EOF
  [[ "$MODE" == secure ]] && chmod 600 "$dir/server.properties"  # holds the keystore password
  return 0
}

cluster_id() {
  local f="$DIR/cluster.id"
  if [[ ! -s "$f" ]]; then
    mkdir -p "$DIR"
    java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid >"$f"
  fi
  cat "$f"
}

format_storage() {
  local n="$1" dir
  dir="$(node_dir "$n")"
  [[ -f "$dir/data/meta.properties" ]] && return 0
  local scram=()
  [[ "$MODE" == secure ]] && mapfile -t scram < <(secure_scram_arguments)
  java -cp "$KAFKA_LIBS/*" -Dlog4j2.configurationFile="$REPO_ROOT/deploy/local/kafka/log4j2.properties" \
    kafka.tools.StorageTool format -t "$(cluster_id)" -c "$dir/server.properties" "${scram[@]}" \
    >"$dir/format.log" 2>&1 \
    || { cat "$dir/format.log" >&2; die "formatting storage of node $n failed"; }
}

launch_node() {
  local n="$1" dir
  dir="$(node_dir "$n")"
  if pid_is_alive "$(pid_file "$n")"; then
    return 0
  fi
  local port
  for port in "$(client_port "$n")" "$(controller_port "$n")"; do
    port_is_open "$port" && die "port $port is taken by another process (not this script's node $n); stop it or set another port"
  done
  # shellcheck disable=SC2086
  nohup java $HEAP $JIT -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$REPO_ROOT/deploy/local/kafka/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" >>"$(log_file "$n")" 2>&1 &
  echo $! >"$(pid_file "$n")"
}

wait_ready() {
  local n="$1" deadline=$((SECONDS + READY_TIMEOUT_S))
  local log
  log="$(log_file "$n")"
  until port_is_open "$(client_port "$n")" && grep -q "Kafka Server started" "$log" 2>/dev/null; do
    if ! pid_is_alive "$(pid_file "$n")"; then
      tail -n 40 "$log" >&2 || true
      die "Kafka node $n exited during start-up (log: $log)"
    fi
    if ((SECONDS > deadline)); then
      tail -n 40 "$log" >&2 || true
      die "Kafka node $n not ready after ${READY_TIMEOUT_S}s (log: $log)"
    fi
    sleep 0.2
  done
}

start_nodes() {
  require_java
  resolve_maven_classpath "$REPO_ROOT/deploy/local/kafka/pom.xml" "$KAFKA_LIBS" \
    -Dkafka.version="$KAFKA_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" -Dlog4j.version="$LOG4J_VERSION"
  local n t0=$SECONDS
  [[ "$MODE" == secure ]] && secure_prepare
  for n in "$@"; do
    write_config "$n"
    format_storage "$n"
    # A restarted node must not see its previous "started" line.
    pid_is_alive "$(pid_file "$n")" || : >"$(log_file "$n")"
    launch_node "$n"
  done
  for n in "$@"; do wait_ready "$n"; done
  info "Kafka $KAFKA_VERSION ($MODE) ready on $(bootstrap_servers) in $((SECONDS - t0))s"
}

signal_node() {
  local sig="$1" n="$2"
  pid_is_alive "$(pid_file "$n")" || die "node $n is not running"
  kill "-$sig" "$(cat "$(pid_file "$n")")"
}

stop_node() {
  local n="$1" pid
  pid_is_alive "$(pid_file "$n")" || return 0
  pid="$(cat "$(pid_file "$n")")"
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS > deadline)); then
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$(pid_file "$n")"
}

node_arg() {
  local n="${1:-}"
  [[ " ${NODES[*]} " == *" $n "* ]] || die "NODE must be one of: ${NODES[*]}"
  echo "$n"
}

cmd="${1:-}"
case "$cmd" in
  start) start_nodes "${NODES[@]}" ;;
  stop)
    for n in "${NODES[@]}"; do stop_node "$n"; done
    [[ "${2:-}" == "--wipe" ]] && rm -rf "$DIR"
    info "Kafka ($MODE) stopped"
    ;;
  status)
    for n in "${NODES[@]}"; do
      if pid_is_alive "$(pid_file "$n")"; then echo "node $n: running (pid $(cat "$(pid_file "$n")"), port $(client_port "$n"))"
      else echo "node $n: stopped"; fi
    done
    ;;
  logs) tail -n "${2:-100}" "$(log_file "${NODES[0]}")" ;;
  bootstrap) bootstrap_servers ;;
  credentials)
    [[ "$MODE" == secure ]] || die "credentials: only with --secure"
    [[ -f "$SECURE_DIR/credentials.env" ]] || die "no credentials yet: run $0 --secure start"
    echo "$SECURE_DIR/credentials.env"
    ;;
  kill) signal_node KILL "$(node_arg "${2:-}")"; rm -f "$(pid_file "$2")" ;;
  pause) signal_node STOP "$(node_arg "${2:-}")" ;;
  resume) signal_node CONT "$(node_arg "${2:-}")" ;;
  restart) n="$(node_arg "${2:-}")"; stop_node "$n"; start_nodes "$n" ;;
  *)
    echo "usage: $0 [--cluster|--secure] start|stop [--wipe]|status|logs [N]|bootstrap|kill N|pause N|resume N|restart N" >&2
    echo "       $0 --secure credentials" >&2
    exit 2
    ;;
esac
