"""Timers and state TTL through restore and the Spark compaction job (docs/guarantees.md: timers-exactly-once): the
timer and TTL entries are state entries, so a restore from the changelog and one from a compacted snapshot give the
same state, expired keys stay gone, and a timer scheduled before the compaction fires once after it."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from pipeline.testing import checker, inputs
from pipeline.testing.harness import Fleet, committed_offsets, wait_caught_up
from snapshots.compact import Options, compact
from tests.snapshots.helpers import restore
from tests.snapshots.timed_app import IDLE_MS, TTL_MS
from tests.snapshots.timed_app import app as timed

pytestmark = pytest.mark.spark
PARTITIONS = 2
# Event time ends before now: the broker deletes records older than retention.ms by their timestamps.
T0 = time.time_ns() // 1_000_000 // 10_000 * 10_000 - 200_000
EARLY = [f"early-{i}" for i in range(40)]  # one record each at the start: expired by TTL, their timers pending


def record(i: int, key: str, ts: int) -> tuple[int, bytes, bytes, int]:
    return inputs.account_partition(key.encode(), PARTITIONS), key.encode(), orjson.dumps({"id": i}), ts


def test_timers_and_ttl_survive_restore_and_compaction_and_fire_once_after_it(spark, kafka_bootstrap, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    app = timed.with_topics(f"timed-in-{suffix}", f"timed-out-{suffix}")
    app_id = f"timed-{suffix}"
    inputs.create_topics(kafka_bootstrap, {app.input_topic: PARTITIONS, app.output_topic: PARTITIONS})
    fleet = Fleet(
        "tests.snapshots.timed_app:app",
        kafka_bootstrap,
        {"PIPELINE_APP_ID": app_id, "PIPELINE_INPUT_TOPIC": app.input_topic, "PIPELINE_OUTPUT_TOPIC": app.output_topic},
        tmp_path,
    )
    # Phase 1: the early accounts once, then 3,000 records of 100 busy accounts moving stream time to T0 + 41 s.
    early = [record(i, key, T0 + i) for i, key in enumerate(EARLY)]
    busy = [record(1_000 + j, f"busy-{j % 100}", T0 + 11_000 + j * 10) for j in range(3_000)]
    try:
        inputs.produce(kafka_bootstrap, app.input_topic, early + busy, partitions=PARTITIONS)
        fleet.start(1)
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleet.logs()
        fleet.stop_all()
        committed = committed_offsets(kafka_bootstrap, app_id, app.input_topic, list(range(PARTITIONS)), 10)
        from_changelog = {p: restore(kafka_bootstrap, app_id, p, committed[p])[0] for p in range(PARTITIONS)}
        merged = {k: v for state in from_changelog.values() for k, v in state.items()}
        assert not any(key in merged or f"__eos.ttl/{key}" in merged for key in EARLY)  # expired: tombstones
        assert all(f"__eos.timer.stream/{key}" in merged for key in EARLY)  # their timers: still pending
        assert sum(key.startswith("busy-") for key in merged) == 100

        report = compact(spark, Options(kafka_bootstrap, app_id, timeout_s=30))
        assert report.published == list(range(PARTITIONS)), report.summary()
        for p in range(PARTITIONS):
            state, job = restore(kafka_bootstrap, app_id, p, committed[p])
            assert job.snapshot is not None and job.records == 0  # all of it from the snapshot
            assert state == from_changelog[p]

        # Phase 2: stream time moves past T0 + IDLE_MS: the early timers (in the snapshot only) fire, once.
        later = [record(5_000 + j, f"busy-{j % 100}", T0 + 41_000 + j * 20) for j in range(4_000)]
        inputs.produce(kafka_bootstrap, app.input_topic, later, partitions=PARTITIONS)
        fleet.start(1)
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleet.logs()
        fleet.stop_all()
    finally:
        fleet.stop_all()
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()
    idle = [orjson.loads(out.value) for out in verdict.final_outputs if out.key.decode() in EARLY]
    assert len(idle) == 2 * len(EARLY) and idle.count({"idle": 1}) == len(EARLY)  # each: 1 record, 1 firing
    assert TTL_MS < 41_000 < IDLE_MS < 41_000 + 4_000 * 20
