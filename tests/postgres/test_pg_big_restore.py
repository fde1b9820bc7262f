"""A PostgreSQL-sink partition with 1,000,000 state rows restores between polls: the consumer keeps its group
membership although the restore lasts longer than max.poll.interval.ms, and the outputs then continue exactly once
(docs/guarantees.md: restore-keeps-membership, pg-epoch-fence)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from psycopg import sql

from pipeline.examples.running_totals_pg import TotalsSink
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.sinks.postgres import task as task_module
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.sinks.postgres.schema import STATE, ensure_schema
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import checker, inputs, postgres_checker
from tests.integration.test_restore import running
from tests.plugins.postgres import connect
from tests.postgres.conftest import runner_settings
from tests.support import eventually

pytestmark = pytest.mark.postgres
BULK_ROWS = 1_000_000
TOTALS_PG = "pipeline.examples.running_totals_pg:app"
BULK_PREFIX = "bulk-"  # keys no input record has: the checker's reference never sees them


@pytest.fixture
def slow_pages(monkeypatch) -> list[int]:
    """Every page of the restore takes 100 ms longer: 100 pages of 10,000 rows make it last over 10 s, longer than
    max.poll.interval.ms (6 s) whatever the machine's speed. Returns the pages read so far (a list of one count)."""
    original, pages = task_module.PostgresTask._read_page, [0]

    def slow_read_page(self, conn):
        time.sleep(0.1)
        pages[0] += 1
        return original(self, conn)

    monkeypatch.setattr(task_module.PostgresTask, "_read_page", slow_read_page)
    return pages


def bulk_state(dsn: str, schema: str, target: Target, partition: int) -> None:
    """BULK_ROWS state rows of p, written with COPY (about 2 s)."""
    with connect(dsn, autocommit=True) as conn:
        ensure_schema(conn, schema, TotalsSink.tables)
        statement = sql.SQL("COPY {} (app_id, topic, input_partition, key, value) FROM STDIN")
        with conn.cursor() as cur, cur.copy(statement.format(STATE.ident(schema))) as copy:
            for i in range(BULK_ROWS):
                copy.write_row((target.app_id, target.input_topic, partition, f"{BULK_PREFIX}{i}", b"[1,%d]" % i))


def test_a_million_state_rows_restore_between_polls_and_the_outputs_continue_exactly_once(
    kafka_bootstrap, postgres_dsn, pg_schema, slow_pages, monkeypatch, capsys
):
    """A second member joins while p is restoring: the group's rebalance needs the first member to rejoin within
    max.poll.interval.ms (the rebalance time-out), which it can only do between polls. A restore that kept the poll
    thread (or the assignment callback) for longer loses p to the rebalance."""
    suffix = uuid.uuid4().hex[:8]
    app_id, topic = f"pg-big-{suffix}", f"pg-big-in-{suffix}"
    target = Target(pg_schema, totals_pg, app_id, topic)
    inputs.create_topics(kafka_bootstrap, {topic: 1})
    bulk_state(postgres_dsn, pg_schema, target, 0)
    inputs.produce_running_totals(kafka_bootstrap, topic, 2_000, partitions=1, seed=7)  # waiting during the restore
    config = runner_settings(
        kafka_bootstrap,
        postgres_dsn,
        pg_schema,
        app_id,
        topic,
        postgres_idle_in_transaction_timeout_ms=1_000,
        max_poll_interval_ms=6_000,
        session_timeout_ms=6_000,
        request_timeout_ms=2_000,
        restore_step_ms=100,
    )
    first, second = PostgresRunner(totals_pg, config), PostgresRunner(totals_pg, config)
    with running(first):
        eventually(lambda: slow_pages[0] >= 5, timeout_s=60)  # restoring
        with running(second):
            lag = postgres_checker.wait_caught_up(kafka_bootstrap, postgres_dsn, target, [0], timeout_s=90)
            restored = first.metrics.restore_records.labels("0")._value.get()
            restore_seconds = first.metrics.restore_seconds.labels("0")._value.get()
    assert not lag, f"offsets table did not catch up: {lag}"
    assert first.metrics.lost._value.get() == 0
    assert restored == BULK_ROWS and not second.tasks  # restored once, by the member that kept p
    assert restore_seconds > 6  # longer than max.poll.interval.ms

    with connect(postgres_dsn, autocommit=True) as conn:  # the bulk rows stayed as they were; then out of the way
        deleted = conn.execute(
            sql.SQL("DELETE FROM {} WHERE key LIKE %s").format(STATE.ident(pg_schema)), (BULK_PREFIX + "%",)
        ).rowcount
    assert deleted == BULK_ROWS
    # `pipeline verify` picks the table checker from the settings `pipeline run` reads (PIPELINE_SINK).
    for name, value in (("SINK", "postgres"), ("POSTGRES_DSN", postgres_dsn), ("POSTGRES_SCHEMA", pg_schema)):
        monkeypatch.setenv(f"PIPELINE_{name}", value)
    exit_code = checker.main(
        [TOTALS_PG, "--bootstrap-servers", kafka_bootstrap, "--input-topic", topic, "--group-id", app_id, "--json"]
    )
    verdict = json.loads(capsys.readouterr().out)
    assert exit_code == 0 and verdict["ok"] and verdict["counts"]["outputs"] == 2_000, verdict
