#!/usr/bin/env bash
# A throw-away PostgreSQL on loopback without Docker, from Debian's packages.
#
#   deploy/local/postgres.sh start|stop [--wipe]|restart|status|logs [N]|dsn|kill
#
# Clients on 127.0.0.1:55432 (POSTGRES_PORT overrides), user/password/database pipeline (a superuser of this
# server only). fsync stays on: the exactly-once tests kill the server and count on committed data surviving.
# kill sends SIGKILL to the postmaster (crash tests); the next start runs crash recovery.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PORT="${POSTGRES_PORT:-55432}"
READY_TIMEOUT_S="${POSTGRES_READY_TIMEOUT_S:-60}"
DIR="$RUN_DIR/postgres"
DATA="$DIR/data"
LOG="$DIR/server.log"
OS_USER=postgres # postgres refuses to run as root

# The bin dir of the highest installed server version (a client-only package has a bin dir without postgres in it).
pg_bin_dir() {
  local servers
  servers=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V) || true
  if [[ -z "$servers" ]]; then
    install_server
    servers=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V) || true
    [[ -n "$servers" ]] || die "apt-get installed no PostgreSQL server under /usr/lib/postgresql"
  fi
  dirname "$(tail -n 1 <<<"$servers")"
}

install_server() {
  ((EUID == 0)) || die "no PostgreSQL server under /usr/lib/postgresql; install it: sudo apt-get install postgresql"
  info "installing PostgreSQL from Debian packages"
  # Only the binaries are wanted: no 'main' cluster on port 5432.
  mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/eos-pipeline.conf
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } >&2 \
    || die "apt-get install postgresql failed"
}
[[ "${1:-}" == dsn ]] || PG_BIN="$(pg_bin_dir)"

# Runs a server binary as the postgres system user when we are root, from a directory that user can enter.
as_pg() {
  if ((EUID == 0)); then
    (cd / && runuser -u "$OS_USER" -- "$@")
  else
    "$@"
  fi
}

prepare_dir() {
  mkdir -p "$DIR"
  ((EUID == 0)) || return 0
  id -u "$OS_USER" >/dev/null 2>&1 \
    || useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$OS_USER"
  chown "$OS_USER:" "$DIR"
  as_pg test -w "$DIR" \
    || die "user $OS_USER cannot write $DIR (is a parent directory not searchable?); set PIPELINE_RUN_DIR elsewhere"
}

# initdb into a scratch dir and move it into place, so that a failed init never leaves a half-made cluster.
init_cluster() {
  [[ -f "$DATA/PG_VERSION" ]] && return 0
  local tmp="$DIR/data.init"
  rm -rf "$tmp"
  as_pg bash -c 'umask 077 && echo pipeline >"$1"' _ "$DIR/pwfile"
  as_pg "$PG_BIN/initdb" -D "$tmp" -U pipeline --pwfile="$DIR/pwfile" --auth-host=scram-sha-256 --auth-local=peer \
    -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
  rm -f "$DIR/pwfile"
  cat >>"$tmp/postgresql.conf" <<EOF

# deploy/local/postgres.sh (port and listen address are given on the command line at start)
unix_socket_directories = ''
shared_buffers = 32MB
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
  as_pg "$PG_BIN/postgres" --single -D "$tmp" postgres <<<"CREATE DATABASE pipeline;" >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log" >&2; die "creating database pipeline failed"; }
  mv "$tmp" "$DATA"
}

postmaster_pid() { head -n 1 "$DATA/postmaster.pid" 2>/dev/null; }

is_running() {
  local pid
  pid="$(postmaster_pid)" && [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

is_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U pipeline -d pipeline -t 2; }

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until is_ready; do
    is_running || { tail -n 40 "$LOG" >&2 || true; die "PostgreSQL exited during start-up (log: $LOG)"; }
    ((SECONDS <= deadline)) || { tail -n 40 "$LOG" >&2 || true; die "PostgreSQL not ready after ${READY_TIMEOUT_S}s (log: $LOG)"; }
    sleep 0.2
  done
}

start() {
  local t0=$SECONDS
  if is_running; then
    is_ready || die "PostgreSQL is running (pid $(postmaster_pid)) but not answering on port $PORT (started with another POSTGRES_PORT?)"
    return 0
  fi
  port_is_open "$PORT" && die "port $PORT is taken by another process (not this script's PostgreSQL); stop it or set POSTGRES_PORT"
  prepare_dir
  init_cluster
  # -w: pg_ctl waits (bounded) for the postmaster to report ready or to die; pg_isready then confirms the TCP port.
  as_pg "$PG_BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t "$READY_TIMEOUT_S" -s \
    -o "-c listen_addresses=127.0.0.1 -c port=$PORT" \
    || { tail -n 40 "$LOG" >&2 || true; die "PostgreSQL did not start (log: $LOG)"; }
  wait_ready
  info "PostgreSQL $(basename "$(dirname "$PG_BIN")") ready on 127.0.0.1:$PORT in $((SECONDS - t0))s"
}

stop() {
  is_running || return 0
  as_pg "$PG_BIN/pg_ctl" stop -D "$DATA" -m fast -w -t 30 -s \
    || as_pg "$PG_BIN/pg_ctl" stop -D "$DATA" -m immediate -w -t 10 -s \
    || die "PostgreSQL (pid $(postmaster_pid)) did not stop"
}

# SIGKILL the postmaster like a crash, then wait until its children have noticed and exited, so that start can
# reuse the data dir (postgres refuses while old backends still hold its shared memory).
crash() {
  is_running || die "PostgreSQL is not running"
  local pid children
  pid="$(postmaster_pid)"
  children="$(pgrep -P "$pid" || true)"
  kill -KILL "$pid"
  local deadline=$((SECONDS + 15)) c
  for c in $pid $children; do
    while kill -0 "$c" 2>/dev/null; do
      ((SECONDS <= deadline)) || die "process $c of the killed PostgreSQL did not exit within 15s"
      sleep 0.1
    done
  done
  info "PostgreSQL postmaster $pid killed"
}

case "${1:-}" in
  start) start ;;
  stop)
    stop
    [[ "${2:-}" == "--wipe" ]] && rm -rf "$DIR"
    info "PostgreSQL stopped"
    ;;
  restart) stop; start ;;
  kill) crash ;;
  status)
    if is_running; then echo "postgres: running (pid $(postmaster_pid), port $PORT)"; else echo "postgres: stopped"; fi
    ;;
  logs) tail -n "${2:-100}" "$LOG" ;;
  dsn) echo "postgresql://pipeline:pipeline@127.0.0.1:$PORT/pipeline" ;;
  *)
    echo "usage: $0 start|stop [--wipe]|restart|status|logs [N]|dsn|kill" >&2
    exit 2
    ;;
esac
