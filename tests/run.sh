#!/usr/bin/env bash
# `make test` after lint: the whole suite (the second lane's files aside) and, side by side with it, the Kafka fault
# suite again in the runtime's other configurations (the PRODUCERS mode that is not the default; then
# GROUP_PROTOCOL=consumer, KIP-848), then the container-image and Airflow tests. They share the one local broker, each
# test on topics and a group of its own. Side by side rather than one after the other: most of a fault test is waiting
# (paced input, session time-outs), and CI must stay under 40 minutes on 2 cores. Arguments go to the main run. Exit
# status: non-zero if either run failed. The second lane's log: .test-matrix.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PYTEST=(.venv/bin/pytest -p no:cacheprovider)  # the matrix run; the main run is as before
MATRIX_LOG=.test-matrix.log

# One broker for both runs, started before either (two sessions must not race to start it), stopped after both.
started_broker=0
if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]] && ! deploy/local/kafka.sh status | grep -q running; then
    deploy/local/kafka.sh start && started_broker=1
fi
# The same for the Schema Registry (tests/plugins/registry.py).
started_registry=0
if [[ -z "${SCHEMA_REGISTRY_URL:-}" ]] && [[ "$(deploy/local/registry.sh status)" == stopped ]]; then
    deploy/local/registry.sh start && started_registry=1
fi
stop_servers() {
    if [[ $started_broker == 1 && "${KEEP_KAFKA:-}" != 1 ]]; then deploy/local/kafka.sh stop >/dev/null; fi
    if [[ $started_registry == 1 && "${KEEP_REGISTRY:-}" != 1 ]]; then deploy/local/registry.sh stop 2>/dev/null; fi
}
trap stop_servers EXIT

other_producers=$($PY -c 'from pipeline.settings import PER_PARTITION, PER_PROCESS, Settings
print(PER_PROCESS if Settings.producers == PER_PARTITION else PER_PARTITION)')
# The container-image tests (image builds, `make demo` on a fresh machine: 7-12 minutes, mostly podman) and the
# Airflow DAG's run (~1.5 minutes) go in this second lane too, after the matrix, so that neither lane passes ~30
# minutes.
SECOND_LANE=(tests/image tests/infra/test_airflow_dag.py)
(
    PIPELINE_PRODUCERS=$other_producers "${PYTEST[@]}" -q -m "not cluster" tests/faults \
        --basetemp="$(mktemp -d)" && \
    PIPELINE_GROUP_PROTOCOL=consumer "${PYTEST[@]}" -q tests/faults/test_process_faults.py \
        tests/faults/test_standby_promotion.py \
        --basetemp="$(mktemp -d)" && \
    "${PYTEST[@]}" -q "${SECOND_LANE[@]}" --basetemp="$(mktemp -d)"
) >"$MATRIX_LOG" 2>&1 &
matrix=$!

.venv/bin/pytest "${SECOND_LANE[@]/#/--ignore=}" "$@"
main_status=$?
wait $matrix
matrix_status=$?
echo "--- fault suite with PRODUCERS=$other_producers, then GROUP_PROTOCOL=consumer, then ${SECOND_LANE[*]} ($MATRIX_LOG) ---"
grep -E "passed|failed|error|^FAILED|^ERROR" "$MATRIX_LOG" | tail -20
(( main_status == 0 && matrix_status == 0 ))
