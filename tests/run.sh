#!/usr/bin/env bash
# `make test` after lint: the whole suite in four lanes that start together and share the one local broker, registry
# and PostgreSQL (each test has topics, a group and a schema of its own). Side by side rather than one after the
# other: most of a fault test is waiting (paced input, session time-outs), and CI must stay under 40 minutes on 2
# cores.
#   lane 1, the main run (arguments go to it): everything the other lanes don't run, tests/unit, infra, security and
#           postgres among them.
#   lane 2: tests/faults in the default PRODUCERS mode, the process faults again under GROUP_PROTOCOL=consumer
#           (KIP-848).
#   lane 3: tests/faults in the other PRODUCERS mode but `pipeline chaos`'s test (3-4 minutes: the command's
#           verdicts do not depend on the mode, and every fault it injects runs in this mode in test_process_faults),
#           then tests/integration, the Airflow DAG's run, and the process faults that kill, pause and stop instances
#           again with STATE_STORE=disk (the rest of the disk store's faults choose their store themselves; the whole
#           fault suite on disk is in BENCHMARKS.md's disk section, too long to repeat here).
#   lane 4: the container-image tests (image builds, `make demo` on a fresh machine) and tests/snapshots (Spark),
#           then every test of the 3-node cluster (marked `cluster`: they kill and restart its nodes, so they all run
#           in this one lane, in both PRODUCERS modes: the tests take both in turn).
# The servers the lanes share: a test that kills one holds it alone (PostgreSQL: tests/plugins/postgres.py's lock);
# the broker and the registry are killed by none.
# Measured: with podman's vfs storage the image tests took 32-38 minutes, the longest lane (CI's run of 2026-11-28
# at 00:02: lanes of 35, 32, 32 and 38 minutes); on overlay they take 8 minutes alone from a cold store, 12 beside
# the other lanes. With the cluster's tests (13 minutes) moved over from lane 1, a run from a clean clone took lanes
# of 27, 31, 29 and 25 minutes (33 in all): hence tests/snapshots (3 minutes) moved from lane 2 to lane 4 too.
# Their logs: .test-lane-2.log, .test-lane-3.log and .test-lane-4.log; each lane ends with its 15 slowest tests and
# its time. Exit status: non-zero if any lane failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PYTEST=(.venv/bin/pytest -p no:cacheprovider --durations=15)

# One broker for all lanes, started before any (two sessions must not race to start it), stopped after all.
started_broker=0
if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]] && ! deploy/local/kafka.sh status | grep -q running; then
    deploy/local/kafka.sh start && started_broker=1
fi
# The same for the Schema Registry (tests/plugins/registry.py).
started_registry=0
if [[ -z "${SCHEMA_REGISTRY_URL:-}" ]] && [[ "$(deploy/local/registry.sh status)" == stopped ]]; then
    deploy/local/registry.sh start && started_registry=1
fi
# And for PostgreSQL: a lane that started it would stop it at its end, under the other lanes' tests.
started_postgres=0
if [[ -z "${POSTGRES_DSN:-}" ]] && ! deploy/local/postgres.sh status | grep -q running; then
    deploy/local/postgres.sh start >/dev/null && started_postgres=1
fi
stop_servers() {
    if [[ $started_broker == 1 && "${KEEP_KAFKA:-}" != 1 ]]; then deploy/local/kafka.sh stop >/dev/null; fi
    if [[ $started_registry == 1 && "${KEEP_REGISTRY:-}" != 1 ]]; then deploy/local/registry.sh stop 2>/dev/null; fi
    if [[ $started_postgres == 1 && "${KEEP_POSTGRES:-}" != 1 ]]; then deploy/local/postgres.sh stop >/dev/null; fi
}
trap stop_servers EXIT

other_producers=$($PY -c 'from pipeline.settings import PER_PARTITION, PER_PROCESS, Settings
print(PER_PROCESS if Settings.producers == PER_PARTITION else PER_PARTITION)')
LANE_3_ONLY=(tests/integration tests/infra/test_airflow_dag.py)
LANE_4_ONLY=(tests/image tests/snapshots)
START=$(date +%s)
elapsed() { echo "$(( $(date +%s) - START )) s"; }

# Every part of a lane runs, whatever the one before it gave, so that one red run shows every failure.
lane_2() {
    local failed=0
    "${PYTEST[@]}" -q -m "faults and not cluster" tests/faults --basetemp="$(mktemp -d)" || failed=1
    PIPELINE_GROUP_PROTOCOL=consumer "${PYTEST[@]}" -q tests/faults/test_process_faults.py \
        tests/faults/test_standby_promotion.py --basetemp="$(mktemp -d)" || failed=1
    echo "lane 2 ended after $(elapsed)"
    return $failed
}
lane_3() {
    local failed=0
    PIPELINE_PRODUCERS=$other_producers "${PYTEST[@]}" -q -m "faults and not cluster" tests/faults \
        --deselect tests/faults/test_chaos_command.py --basetemp="$(mktemp -d)" || failed=1
    "${PYTEST[@]}" -q "${LANE_3_ONLY[@]}" --basetemp="$(mktemp -d)" || failed=1
    PIPELINE_STATE_STORE=disk "${PYTEST[@]}" -q tests/faults/test_process_faults.py \
        -k "sigkill_at_random or zombie or sigterm" --basetemp="$(mktemp -d)" || failed=1
    echo "lane 3 ended after $(elapsed)"
    return $failed
}
lane_4() {
    local failed=0
    "${PYTEST[@]}" -q "${LANE_4_ONLY[@]}" --basetemp="$(mktemp -d)" || failed=1
    "${PYTEST[@]}" -q -m cluster tests "${LANE_4_ONLY[@]/#/--ignore=}" --basetemp="$(mktemp -d)" || failed=1
    echo "lane 4 ended after $(elapsed)"
    return $failed
}
lane_2 >.test-lane-2.log 2>&1 &
lane_2_pid=$!
lane_3 >.test-lane-3.log 2>&1 &
lane_3_pid=$!
lane_4 >.test-lane-4.log 2>&1 &
lane_4_pid=$!

"${PYTEST[@]}" -m "not faults and not cluster" "${LANE_3_ONLY[@]/#/--ignore=}" "${LANE_4_ONLY[@]/#/--ignore=}" "$@"
main_status=$?
echo "--- lane 1 ended after $(elapsed) ---"
wait $lane_2_pid
lane_2_status=$?
echo "--- lane 2 (.test-lane-2.log): tests/faults, the process faults under KIP-848 ---"
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR|ended after" .test-lane-2.log | tail -20
wait $lane_3_pid
lane_3_status=$?
echo "--- lane 3 (.test-lane-3.log): tests/faults with PRODUCERS=$other_producers, ${LANE_3_ONLY[*]}, the process faults on STATE_STORE=disk ---"
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR|ended after" .test-lane-3.log | tail -20
wait $lane_4_pid
lane_4_status=$?
echo "--- lane 4 (.test-lane-4.log): ${LANE_4_ONLY[*]}, the 3-node cluster's tests ---"
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR|ended after" .test-lane-4.log | tail -20
(( main_status == 0 && lane_2_status == 0 && lane_3_status == 0 && lane_4_status == 0 ))
