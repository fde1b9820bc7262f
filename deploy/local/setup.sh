#!/usr/bin/env bash
# Everything the demo and the tests need on a fresh Debian machine without Docker:
# JDK + Maven + PostgreSQL + curl (Debian packages, only if missing), the Python virtualenv, the Kafka broker and
# Spark's Kafka connector (Maven Central, cached). Safe to run again: each step skips what is already there.
# `make test` also builds the Schema Registry (deploy/local/registry.sh build), which the demo does not need.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

missing_packages=()
command -v java >/dev/null 2>&1 || missing_packages+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing_packages+=(maven)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing_packages+=(postgresql)
# Last: tests/image/test_fresh_machine.py looks for "openjdk-17-jdk-headless maven postgresql" as they were.
command -v curl >/dev/null 2>&1 || missing_packages+=(curl)
if ((${#missing_packages[@]})); then
  info "installing Debian packages: ${missing_packages[*]}"
  [[ $(id -u) -eq 0 ]] || die "need root (or sudo) to install: ${missing_packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if [[ " ${missing_packages[*]} " == *" postgresql "* ]]; then
    # deploy/local/postgres.sh runs its own server: no 'main' cluster on port 5432 (as its own install does).
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/eos-pipeline.conf
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  info "creating .venv"
  "$PYTHON" -m venv .venv
fi
# The exact versions CI and the images test (requirements/, written by `make lock` from pyproject.toml's ranges),
# checked against their hashes; then the project itself, editable, without resolving anything again.
LOCK=requirements/dev.txt
if [[ ! -f .venv/.installed ]] || [[ pyproject.toml -nt .venv/.installed ]] || [[ $LOCK -nt .venv/.installed ]]; then
  info "installing Python packages ($LOCK)"
  .venv/bin/pip install -q --require-hashes -r "$LOCK"
  .venv/bin/pip install -q --no-deps -e .
  touch .venv/.installed
fi

resolve_maven_classpath "$REPO_ROOT/deploy/local/kafka/pom.xml" "$CACHE_DIR/kafka-$KAFKA_VERSION/libs" \
  -Dkafka.version="$KAFKA_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" -Dlog4j.version="$LOG4J_VERSION"
if [[ -x deploy/local/spark.sh ]]; then
  deploy/local/spark.sh classpath >/dev/null
fi
info "setup complete"
