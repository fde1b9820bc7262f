"""The PostgreSQL sink and input records deleted before they were processed: p stops with an ERROR naming what was
lost and the fix; the offsets table stays where the gap begins (docs/guarantees.md: no-silent-skip)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import inputs, postgres_checker
from tests.integration.test_restore import running
from tests.postgres.conftest import runner_settings
from tests.support import eventually

pytestmark = pytest.mark.postgres


def test_input_records_deleted_before_processing_stop_the_partition(kafka_bootstrap, postgres_dsn, pg_schema, caplog):
    suffix = uuid.uuid4().hex[:8]
    app_id, topic = f"pg-gone-{suffix}", f"pg-gone-in-{suffix}"
    target = Target(pg_schema, totals_pg, app_id, topic)
    inputs.create_topics(kafka_bootstrap, {topic: 1})
    config = runner_settings(kafka_bootstrap, postgres_dsn, pg_schema, app_id, topic)
    inputs.produce_running_totals(kafka_bootstrap, topic, 100, partitions=1, seed=1)
    with running(PostgresRunner(totals_pg, config)):
        assert not postgres_checker.wait_caught_up(kafka_bootstrap, postgres_dsn, target, [0], timeout_s=60)
    inputs.produce_running_totals(kafka_bootstrap, topic, 100, partitions=1, seed=2)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept: a collected client never answers
    tp = TopicPartition(topic, 0, 150)
    admin.delete_records([tp], request_timeout=10)[tp].result(10)
    runner = PostgresRunner(totals_pg, config)
    with running(runner):
        # p0 stopped, the only partition: the runner ends by itself (docs/guarantees.md: fail-fast)
        eventually(lambda: runner.metrics.registry.get_sample_value("pipeline_stopped_partitions") == 1, 30)
    assert "the records from offset 100 on were deleted before they were processed" in caplog.text
    lag = postgres_checker.wait_caught_up(kafka_bootstrap, postgres_dsn, target, [0], timeout_s=1)
    assert lag == {0: 100}, "the offsets table moved past the gap"
