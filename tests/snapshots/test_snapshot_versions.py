"""A state version change on a real broker: v1 runs, its state is compacted into a snapshot, v2 (a new value shape
with a migrate) restores it, migrates and continues exactly; v1 started again refuses the newer state."""

from __future__ import annotations

import re
import uuid

import pytest

from pipeline.testing import checker, inputs
from pipeline.testing.harness import Fleet, wait_caught_up
from snapshots.compact import Options, compact
from tests.snapshots.versioned_app import v2
from tests.support import eventually

pytestmark = pytest.mark.spark
PARTITIONS = 2


def test_v1_then_compaction_then_v2_migrates_and_continues_exactly_and_v1_refuses(spark, kafka_bootstrap, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    app = v2.with_topics(f"vers-in-{suffix}", f"vers-out-{suffix}")
    app_id = f"vers-{suffix}"
    inputs.create_topics(kafka_bootstrap, {app.input_topic: PARTITIONS, app.output_topic: PARTITIONS})
    env = {
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": app.input_topic,
        "PIPELINE_OUTPUT_TOPIC": app.output_topic,
    }
    fleets = {v: Fleet(f"tests.snapshots.versioned_app:{v}", kafka_bootstrap, env, tmp_path / v) for v in ("v1", "v2")}
    try:
        inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 3_000, partitions=PARTITIONS, seed=1)
        fleets["v1"].start(1)
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleets["v1"].logs()
        fleets["v1"].stop_all()
        report = compact(spark, Options(kafka_bootstrap, app_id, timeout_s=30))  # v1 values, in the snapshot
        assert report.published == list(range(PARTITIONS)), report.summary()

        inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 3_000, partitions=PARTITIONS, seed=2)
        fleets["v2"].start(1)
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleets["v2"].logs()
        fleets["v2"].stop_all()
        assert re.search(r"restored: \d+ keys from [1-9]\d* snapshot entries", fleets["v2"].logs())  # v1's, migrated

        rollback = fleets["v1"].start(1)[0]
        eventually(lambda: not rollback.alive, timeout_s=60)
        assert rollback.process.returncode != 0
        assert "written by state version 2, this code is at version 1" in rollback.log_path.read_text()
    finally:
        for fleet in fleets.values():
            fleet.stop_all()
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()
    assert verdict.outputs == 6_000
