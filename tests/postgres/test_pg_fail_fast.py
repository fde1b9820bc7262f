"""Mistakes stop a partition loudly through the PostgreSQL sink (docs/guarantees.md: fail-fast): the cases of
tests/integration/test_fail_fast_real.py, with the PostgresRunner in this process."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.app import App
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from tests.integration.test_fail_fast_real import config, stopped, topics_with
from tests.integration.test_restore import running
from tests.support import eventually

pytestmark = pytest.mark.postgres


def pg_runner(
    app: App, bootstrap: str, dsn: str, schema: str, records: list[tuple[bytes, bytes]], **overrides: Any
) -> PostgresRunner:
    app_id, input_topic, output_topic = topics_with(bootstrap, records)
    extra = {"sink": "postgres", "postgres_dsn": dsn, "postgres_schema": schema}
    return PostgresRunner(app, config(bootstrap, app_id, input_topic, output_topic, **extra, **overrides))


def test_on_poison_stop_on_the_first_record_of_a_partition_stops_it(
    kafka_bootstrap: str, postgres_dsn: str, pg_schema: str
) -> None:
    runner = pg_runner(totals_pg, kafka_bootstrap, postgres_dsn, pg_schema, [(b"acct", b"{bad")], on_poison="stop")
    with running(runner):
        eventually(lambda: stopped(runner), 30)
