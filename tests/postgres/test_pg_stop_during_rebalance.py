"""The PostgreSQL sink's runner, stopped while the group's assignment waits to be served: nothing taken over, a clean
end (the poll loop's, shared with the Kafka sink: tests/integration/test_stop_during_rebalance.py)."""

from __future__ import annotations

import uuid

import pytest

from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from tests.integration.test_stop_during_rebalance import stop_while_an_assignment_waits
from tests.postgres.conftest import runner_settings

pytestmark = pytest.mark.postgres


def test_a_stop_while_an_assignment_waits_takes_nothing_over(
    kafka_bootstrap, new_topic, postgres_dsn, pg_schema, caplog
):
    app_id, topic = f"pg-stop-{uuid.uuid4().hex[:8]}", new_topic("in", partitions=2)
    config = runner_settings(kafka_bootstrap, postgres_dsn, pg_schema, app_id, topic)
    stop_while_an_assignment_waits(PostgresRunner(totals_pg, config), kafka_bootstrap, 2, caplog)
