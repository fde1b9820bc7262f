#!/usr/bin/env bash
# Entry point of the broker image (deploy/image/servers.sh): one KRaft broker+controller with the settings of
# deploy/local/kafka.sh, formatted on first start, the JVM as PID 1 (SIGTERM shuts it down cleanly).
#
# Listeners: clients on 0.0.0.0:9092 (the port to publish), advertised as KAFKA_ADVERTISED_ADDRESS (host:port, default
# localhost:9092), the address clients reach the published port at. With port mapping that address is only known
# once the engine has picked the host port: KAFKA_ADVERTISED_ADDRESS_FILE=PATH makes the broker wait (up to
# KAFKA_ADVERTISED_WAIT_S, default 60) for that file to hold it. The broker's own connections (a transaction
# coordinator writing commit markers to a partition leader, itself here) go to a separate listener on 127.0.0.1:9091:
# the clients' advertised address does not lead back into the container.
set -euo pipefail

KAFKA_HOME=/opt/kafka
STATE=/var/lib/kafka
CLIENT_PORT=9092 BROKER_PORT=9091 CONTROLLER_PORT=9093

die() {
  echo "error: $*" >&2
  exit 1
}

advertised_address() {
  local file="${KAFKA_ADVERTISED_ADDRESS_FILE:-}" wait_s="${KAFKA_ADVERTISED_WAIT_S:-60}" address
  if [[ -z "$file" ]]; then
    address="${KAFKA_ADVERTISED_ADDRESS:-localhost:$CLIENT_PORT}"
  else
    [[ "$wait_s" =~ ^[0-9]+$ ]] || die "KAFKA_ADVERTISED_WAIT_S must be a number of seconds, not '$wait_s'"
    local deadline=$((SECONDS + wait_s))
    until [[ -s "$file" ]]; do
      ((SECONDS < deadline)) || die "KAFKA_ADVERTISED_ADDRESS_FILE: nothing wrote $file within ${wait_s}s"
      sleep 0.1
    done
    address="$(tr -d '[:space:]' <"$file")"
  fi
  [[ "$address" =~ ^[A-Za-z0-9._:-]+:[0-9]+$ ]] \
    || die "the advertised address must be host:port (KAFKA_ADVERTISED_ADDRESS or its _FILE), not '$address'"
  echo "$address"
}

write_config() {
  local address="$1"
  {
    cat "$KAFKA_HOME/config/broker.properties"
    cat <<EOF
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://0.0.0.0:$CLIENT_PORT,BROKER://127.0.0.1:$BROKER_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$address,BROKER://127.0.0.1:$BROKER_PORT
inter.broker.listener.name=BROKER
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$STATE/data
EOF
  } >"$STATE/server.properties"
}

address="$(advertised_address)"
write_config "$address"
LOG4J="-Dlog4j2.configurationFile=$KAFKA_HOME/config/log4j2.properties"
if [[ ! -f "$STATE/data/meta.properties" ]]; then
  java -cp "$KAFKA_HOME/libs/*" "$LOG4J" kafka.tools.StorageTool format \
    -t "${KAFKA_CLUSTER_ID:-Q0VjtZyURgmsRkCTTUfqGg}" -c "$STATE/server.properties" >/dev/null \
    || die "formatting the log directory failed"
fi
echo "advertising PLAINTEXT://$address to clients" >&2
# shellcheck disable=SC2086  # the heap options are several words
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
  "$LOG4J" -cp "$KAFKA_HOME/libs/*" kafka.Kafka "$STATE/server.properties"
