"""The PostgreSQL sink's runner, stopped while the group's assignment waits to be served: nothing taken over, a clean
end (the poll loop's, shared with the Kafka sink: tests/integration/test_stop_during_rebalance.py)."""

from __future__ import annotations

import uuid

import pytest

from pipeline import settings
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from tests.integration.test_stop_during_rebalance import stop_while_an_assignment_waits

pytestmark = pytest.mark.postgres


def test_a_stop_while_an_assignment_waits_takes_nothing_over(
    kafka_bootstrap, new_topic, postgres_dsn, pg_schema, caplog
):
    config = settings.load(
        env={},
        bootstrap_servers=kafka_bootstrap,
        app_id=f"pg-stop-{uuid.uuid4().hex[:8]}",
        input_topic=new_topic("in", partitions=2),
        sink="postgres",
        postgres_dsn=postgres_dsn,
        postgres_schema=pg_schema,
    )
    stop_while_an_assignment_waits(PostgresRunner(totals_pg, config), kafka_bootstrap, 2, caplog)
