#!/usr/bin/env bash
# Spark's Kafka connector for the pyspark in the venv, resolved once from Maven Central.
#
#   deploy/local/spark.sh classpath   prints the connector's jars comma-separated (for spark.jars)
#
# pyspark ships Spark itself; deploy/local/spark/pom.xml adds only what it lacks (connector, kafka-clients, commons-pool2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

JARS_DIR="$CACHE_DIR/spark-kafka-$SPARK_VERSION"

classpath() {
  require_java
  # stdout carries only the result; Maven's own output goes to stderr.
  resolve_maven_classpath "$REPO_ROOT/deploy/local/spark/pom.xml" "$JARS_DIR" \
    -Dspark.version="$SPARK_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" >&2
  local jars=("$JARS_DIR"/*.jar)
  [[ -f "${jars[0]}" ]] || die "no jars in $JARS_DIR; delete it and run again"
  local IFS=,
  echo "${jars[*]}"
}

case "${1:-}" in
  classpath) classpath ;;
  *)
    echo "usage: $0 classpath" >&2
    exit 2
    ;;
esac
