#!/usr/bin/env bash
# Entry point of the PostgreSQL image (deploy/image/servers.sh): on first start a cluster in $PGDATA whose superuser is
# POSTGRES_USER (default postgres) with password POSTGRES_PASSWORD (required), the database POSTGRES_DB (default the
# user's name), password (SCRAM) logins from any address; then the postmaster as PID 1 on 0.0.0.0:5432.
# fsync stays on, as in deploy/local/postgres.sh: the exactly-once tests count on committed data surviving a crash.
set -euo pipefail

die() {
  echo "error: $*" >&2
  exit 1
}

init_cluster() {
  local user="$1" db="$2" pwfile
  pwfile="$(mktemp)"  # mode 600: the password never appears on a command line
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-host=scram-sha-256 --auth-local=trust \
    -E UTF8 --locale=C.UTF-8 >/dev/null || die "initdb failed"
  rm -f "$pwfile"
  # Clients come through the engine's port mapping, from the bridge's gateway address rather than 127.0.0.1.
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  cat >>"$PGDATA/postgresql.conf" <<'EOF'

# deploy/image/postgres/start.sh
listen_addresses = '*'
unix_socket_directories = ''
shared_buffers = 32MB
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
  if [[ "$db" != postgres ]]; then
    postgres --single -D "$PGDATA" postgres <<<"CREATE DATABASE \"${db//\"/\"\"}\";" >/dev/null \
      || die "creating database $db failed"
  fi
}

[[ -n "${POSTGRES_PASSWORD:-}" ]] || die "POSTGRES_PASSWORD is not set: the superuser needs a password"
user="${POSTGRES_USER:-postgres}"
[[ -f "$PGDATA/PG_VERSION" ]] || init_cluster "$user" "${POSTGRES_DB:-$user}"
exec postgres -D "$PGDATA"
