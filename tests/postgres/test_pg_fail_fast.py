"""Mistakes stop a partition loudly through the PostgreSQL sink (docs/guarantees.md: fail-fast): the cases of
tests/integration/test_fail_fast_real.py, with the PostgresRunner in this process."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.app import App
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres.runner import PostgresRunner
from tests.integration.test_fail_fast_real import (
    GOOD,
    assert_stopped_loudly,
    config,
    raises_key_error,
    returns_none,
    topics_with,
)
from tests.integration.test_restore import running

pytestmark = pytest.mark.postgres


def pg_runner(
    app: App, bootstrap: str, dsn: str, schema: str, records: list[tuple[bytes, bytes]], **overrides: Any
) -> PostgresRunner:
    app_id, input_topic, output_topic = topics_with(bootstrap, records)
    extra = {"sink": "postgres", "postgres_dsn": dsn, "postgres_schema": schema}
    return PostgresRunner(app, config(bootstrap, app_id, input_topic, output_topic, **extra, **overrides))


def test_on_poison_stop_on_the_first_record_of_a_partition_stops_it(
    kafka_bootstrap: str, postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    runner = pg_runner(
        totals_pg,
        kafka_bootstrap,
        postgres_dsn,
        pg_schema,
        [(b"acct", b"{bad")],
        on_poison="stop",
        processing_max_attempts=1,
    )
    with running(runner):
        assert_stopped_loudly(runner, caplog, "@0 failed 1 times: SerdeError")


def test_a_mistake_in_process_stops_the_partition_at_once_and_ends_the_runner(
    kafka_bootstrap: str, postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = dataclasses.replace(totals_pg, process=returns_none)
    runner = pg_runner(app, kafka_bootstrap, postgres_dsn, pg_schema, [GOOD, GOOD], processing_max_attempts=5)
    with running(runner):
        assert_stopped_loudly(runner, caplog, "process returned None", "[0]@0", "return a list of Output")


def test_a_dead_letter_storm_stops_the_partition_and_ends_the_runner(
    kafka_bootstrap: str, postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = dataclasses.replace(totals_pg, process=raises_key_error)
    storm = {"dead_letter_storm": 3, "processing_max_attempts": 1}
    runner = pg_runner(app, kafka_bootstrap, postgres_dsn, pg_schema, [GOOD] * 5, **storm)
    with running(runner):
        assert_stopped_loudly(runner, caplog, "dead-letter storm: 3 records in a row failed with KeyError", "@2")
