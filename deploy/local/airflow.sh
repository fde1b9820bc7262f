#!/usr/bin/env bash
# The Airflow that runs deploy/compaction/airflow_dag.py in its test: a virtualenv of its own (Airflow's ~130 packages
# never mix with the project's), installed by uv from requirements/airflow.txt (exact versions and hashes) and cached
# per lock in ~/.cache/eos-pipeline, so a fresh clone on the same machine (CI) reuses it.
#
#   deploy/local/airflow.sh venv     prints the virtualenv's directory, creating it first if needed
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LOCK="$REPO_ROOT/requirements/airflow.txt"
UV="${UV:-$REPO_ROOT/.venv/bin/uv}"

venv() {
  local dir
  dir="$CACHE_DIR/airflow-$(sha256sum "$LOCK" | cut -c1-12)"
  # One install at a time per machine: a second test session (or clone) waits and then reuses the first one's venv.
  mkdir -p "$CACHE_DIR"
  exec 9>"$CACHE_DIR/airflow.lock"
  flock 9
  if [[ ! -f "$dir/.complete" ]]; then
    [[ -x "$UV" ]] || die "$UV not found: make setup installs uv (requirements/dev.txt), or set UV"
    info "installing Airflow into $dir (requirements/airflow.txt)"
    local t0=$SECONDS
    rm -rf "$dir" "$CACHE_DIR"/airflow-*  # the venvs of earlier locks: ~200 MB each
    # The Python that runs the project (3.11), never one uv would download.
    UV_PYTHON_DOWNLOADS=never "$UV" venv -q --python "${PYTHON:-python3}" "$dir" >&2
    # Byte-compiled once here: Airflow imports ~2,000 modules, and PYTHONDONTWRITEBYTECODE would compile them per run.
    "$UV" pip sync -q --require-hashes --compile-bytecode --python "$dir/bin/python" "$LOCK" >&2 || die "could not install $LOCK"
    touch "$dir/.complete"
    info "Airflow installed in $((SECONDS - t0))s"
  fi
  echo "$dir"
}

case "${1:-}" in
  venv) venv ;;
  *)
    echo "usage: $0 venv" >&2
    exit 2
    ;;
esac
