"""The stall watchdog through the PostgreSQL sink's runner (docs/guarantees.md: no-silent-stall): the poll loop and
the watchdog are the core's, so a partition held back by an open upstream transaction is reported the same way as in
the Kafka sink (tests/integration/test_stall_real.py), while the other partition runs on."""

from __future__ import annotations

import logging
import uuid

import pytest

from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from tests.integration.test_stall_real import STALL_WARNING_MS, held_back_by_an_open_transaction
from tests.postgres.conftest import runner_settings

pytestmark = pytest.mark.postgres


def test_a_partition_held_back_by_an_open_transaction_upstream_is_reported(
    kafka_bootstrap, new_topic, postgres_dsn, pg_schema, caplog
):
    caplog.set_level(logging.INFO, "pipeline")
    app_id, topic = f"pg-stall-{uuid.uuid4().hex[:8]}", new_topic("in", partitions=2)
    config = runner_settings(kafka_bootstrap, postgres_dsn, pg_schema, app_id, topic, stall_warning_ms=STALL_WARNING_MS)
    held_back_by_an_open_transaction(PostgresRunner(totals_pg, config), kafka_bootstrap, caplog)
