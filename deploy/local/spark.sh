#!/usr/bin/env bash
# Spark's Kafka connector for the pyspark in the venv, resolved once from Maven Central.
#
#   deploy/local/spark.sh classpath   prints the connector's jars comma-separated (for spark.jars)
#
# pyspark ships Spark itself; deploy/local/spark/pom.xml adds only what it lacks (connector, kafka-clients, commons-pool2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The connector must be built for the Spark that loads it: pyspark's own version. snapshots/spark_session.py passes
# the one it runs with (PYSPARK_VERSION); otherwise .venv's pyspark is asked.
pyspark_version() {
  if [[ -n "${PYSPARK_VERSION:-}" ]]; then
    echo "$PYSPARK_VERSION"
    return
  fi
  local python="$REPO_ROOT/.venv/bin/python"
  [[ -x "$python" ]] || die "$python not found: run make setup, or set PYSPARK_VERSION to the Spark version"
  "$python" -c 'import pyspark; print(pyspark.__version__)' || die "no pyspark in $python (make setup installs it)"
}

classpath() {
  require_java
  local SPARK_VERSION JARS_DIR
  SPARK_VERSION="$(pyspark_version)"
  # Keyed by the pom too: a changed pom resolves again instead of reusing jars it no longer asks for.
  JARS_DIR="$CACHE_DIR/spark-kafka-$SPARK_VERSION-$(sha256sum "$REPO_ROOT/deploy/local/spark/pom.xml" | cut -c1-12)"
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
