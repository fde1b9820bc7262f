"""The live pipeline and the compaction job together: the pipeline keeps running while Spark compacts; after a
SIGKILL the next instance restores from the new snapshot, reading only the changelog tail, and the run is still
exactly-once."""

from __future__ import annotations

import re
import socket
import threading
import urllib.request
import uuid

import pytest

from pipeline.examples.running_totals import app as totals
from pipeline.testing import checker, inputs
from pipeline.testing.harness import Fleet, wait_caught_up
from snapshots.compact import Options, compact
from tests.snapshots.helpers import end_offsets
from tests.support import eventually

pytestmark = pytest.mark.spark
PARTITIONS = 2
ACCOUNTS = 2_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str, partition: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(rf'^{name}{{partition="{partition}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else -1.0


def test_pipeline_runs_during_compaction_then_restores_from_the_snapshot(spark, kafka_bootstrap, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    app = totals.with_topics(f"snap-in-{suffix}", f"snap-out-{suffix}")
    app_id = f"snap-pipeline-{suffix}"
    inputs.create_topics(kafka_bootstrap, {app.input_topic: PARTITIONS, app.output_topic: PARTITIONS})
    env = {
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": app.input_topic,
        "PIPELINE_OUTPUT_TOPIC": app.output_topic,
    }
    fleet = Fleet("pipeline.examples.running_totals:app", kafka_bootstrap, env, tmp_path)
    changelog = f"{app_id}-changelog"
    try:
        inputs.produce_running_totals(
            kafka_bootstrap, app.input_topic, 8_000, partitions=PARTITIONS, accounts=ACCOUNTS, seed=1
        )
        first = fleet.start(1)[0]
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleet.logs()

        # More input arrives and is processed while Spark compacts.
        feeder = threading.Thread(
            target=inputs.produce_running_totals,
            args=(kafka_bootstrap, app.input_topic, 8_000),
            kwargs={"partitions": PARTITIONS, "accounts": ACCOUNTS, "seed": 2},
        )
        feeder.start()
        report = compact(spark, Options(kafka_bootstrap, app_id, timeout_s=30))
        feeder.join()
        assert report.published == [0, 1], report.summary()
        assert first.alive, fleet.logs()
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleet.logs()
        covered = {p: report.partitions[p] for p in range(PARTITIONS)}

        inputs.produce_running_totals(
            kafka_bootstrap, app.input_topic, 1_000, partitions=PARTITIONS, accounts=ACCOUNTS, seed=3
        )
        first.kill()  # SIGKILL, whatever it was doing
        ends = end_offsets(kafka_bootstrap, changelog, PARTITIONS)

        port = free_port()
        fleet.start(1, PIPELINE_METRICS_PORT=str(port))
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, PARTITIONS, 120), fleet.logs()
        for p in range(PARTITIONS):
            entries = eventually(
                lambda p=p: (
                    metric(port, "pipeline_restore_snapshot_entries_total", p) > 0
                    and metric(port, "pipeline_restore_snapshot_entries_total", p)
                ),
                timeout_s=30,
            )
            read = metric(port, "pipeline_restore_records_total", p)
            assert entries == covered[p].entries
            tail = ends[p] - covered[p].changelog_range[1]  # the changelog after the snapshot, markers included
            # Only the tail: none of the history below the snapshot's covered offset was read again.
            assert 0 <= read <= tail < ends[p], f"p{p}: read {read} changelog records, the tail is {tail}"
        fleet.stop_all()
    finally:
        fleet.stop_all()

    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=changelog, group_id=app_id
    )
    assert verdict.ok, verdict.summary()
