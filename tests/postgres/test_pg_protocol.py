"""task(p) of the PostgreSQL sink and its commit (commit_batch) against a real server, in-process, with records handed
in directly: the epoch check rolls a fenced owner's batch back, restore reads offset and state from the tables, a
failed batch leaves nothing, and a writer paused mid-transaction cannot block the next owner's fence for long."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import orjson
import psycopg
import psycopg_pool
import pytest
from confluent_kafka import Message
from psycopg import sql

from pipeline.examples.running_totals_pg import TotalsSink, app
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.runner import commit_batch
from pipeline.sinks.postgres.schema import connection_kwargs, ensure_schema
from pipeline.sinks.postgres.task import Fenced, PostgresTask, PostgresTaskContext, WriteFailed
from tests.fakes import kafka_message
from tests.plugins.postgres import connect

pytestmark = pytest.mark.postgres
TOPIC = "in"


def messages(first: int, last: int, partition: int = 0) -> list[Message]:
    return [
        kafka_message(
            i,
            f"acct-{i % 3}".encode(),
            orjson.dumps({"id": i, "amount": i}),
            partition=partition,
            topic=TOPIC,
            timestamp_ms=0,
        )
        for i in range(first, last)
    ]


@pytest.fixture
def ctx(postgres_dsn: str, pg_schema: str) -> Iterator[PostgresTaskContext]:
    settings = Settings(
        sink="postgres",
        postgres_dsn=postgres_dsn,
        postgres_schema=pg_schema,
        postgres_idle_in_transaction_timeout_ms=1000,
        request_timeout_ms=10_000,
    )
    kwargs = {**connection_kwargs(settings, "test"), "autocommit": True}
    with connect(postgres_dsn, autocommit=True) as conn:
        ensure_schema(conn, pg_schema, TotalsSink.tables)
    with psycopg_pool.ConnectionPool(postgres_dsn, min_size=1, max_size=4, kwargs=kwargs) as pool:
        yield PostgresTaskContext(app, settings, "app", TOPIC, pool, TotalsSink(), Metrics(), "test")


def table(ctx: PostgresTaskContext, query: str) -> list[tuple]:
    with connect(ctx.settings.postgres_dsn) as conn:
        return conn.execute(sql.SQL(query).format(s=sql.Identifier(ctx.settings.postgres_schema))).fetchall()


def test_the_old_owners_batch_fails_the_epoch_check_and_leaves_nothing(ctx):
    old, new = PostgresTask(ctx, 0), PostgresTask(ctx, 0)
    assert old.take_over() is None and old.epoch == 1
    old.process(messages(0, 10))
    assert new.take_over() is None and new.epoch == 2  # fenced before it read anything of p
    with pytest.raises(Fenced, match="epoch 1 fenced"):
        commit_batch(old)
    assert table(ctx, "SELECT count(*) FROM {s}.outputs") == [(0,)]
    assert table(ctx, "SELECT next_offset, epoch FROM {s}.pipeline_offsets") == [(None, 2)]
    new.process(messages(0, 10))
    commit_batch(new)
    assert table(ctx, "SELECT count(*), count(DISTINCT input_offset) FROM {s}.outputs") == [(10, 10)]
    assert table(ctx, "SELECT next_offset, epoch FROM {s}.pipeline_offsets") == [(10, 2)]


def test_restore_reads_offset_and_state_from_the_tables(ctx):
    first = PostgresTask(ctx, 0)
    first.take_over()
    first.process(messages(0, 12))
    commit_batch(first)
    second = PostgresTask(ctx, 0)
    assert second.take_over() == 12
    assert dict(second.state) == dict(first.state) == {"acct-0": [4, 18], "acct-1": [4, 22], "acct-2": [4, 26]}
    second.process(messages(5, 14))  # 5..11 were fetched before the seek took effect: skipped
    commit_batch(second)
    assert table(ctx, "SELECT account, count, sum FROM {s}.totals ORDER BY account") == [
        ("acct-0", 5, 30),
        ("acct-1", 5, 35),
        ("acct-2", 4, 26),
    ]
    assert table(ctx, "SELECT count(*) FROM {s}.outputs") == [(14,)]


def test_a_failing_batch_leaves_nothing_and_the_next_owner_redoes_it(ctx, monkeypatch):
    task = PostgresTask(ctx, 0)
    task.take_over()
    task.process(messages(0, 5))
    commit_batch(task)
    task.process(messages(5, 10))
    original = TotalsSink.write

    def write_then_fail(self, cur, target, rows):
        original(self, cur, target, rows)
        raise RuntimeError("the sink broke after writing its rows")

    monkeypatch.setattr(TotalsSink, "write", write_then_fail)
    with pytest.raises(WriteFailed, match="the sink broke"):
        commit_batch(task)
    monkeypatch.undo()
    assert table(ctx, "SELECT count(*) FROM {s}.outputs") == [(5,)]
    again = PostgresTask(ctx, 0)
    assert again.take_over() == 5
    again.process(messages(5, 10))
    commit_batch(again)
    assert table(ctx, "SELECT count(*), count(DISTINCT input_offset) FROM {s}.outputs") == [(10, 10)]


def test_a_fence_waits_for_an_in_flight_batch_and_then_reads_its_result(ctx):
    """The batch locks p's offsets row with its first statement: a concurrent fence sees all of it or none."""
    old = PostgresTask(ctx, 0)
    old.take_over()
    old.process(messages(0, 8))
    release = threading.Event()
    original = TotalsSink.write

    def slow_write(self, cur, target, rows):
        original(self, cur, target, rows)
        release.wait(10)

    new = PostgresTask(ctx, 0)
    TotalsSink.write = slow_write
    try:
        committing = threading.Thread(target=commit_batch, args=(old,))
        committing.start()
        time.sleep(0.3)  # old holds the row lock now
        taking_over = threading.Thread(target=new.take_over)
        taking_over.start()
        time.sleep(0.3)
        assert taking_over.is_alive(), "the fence did not wait for the in-flight batch"
        release.set()
        committing.join(10)
        taking_over.join(10)
    finally:
        TotalsSink.write = original
    assert (new.epoch, new.committed_offset, new.state["acct-1"]) == (2, 8, [3, 12])


def test_a_writer_paused_mid_transaction_is_ended_by_the_server(ctx):
    """A SIGSTOPped process can hold p's row lock; idle_in_transaction_session_timeout (1 s here) ends its session."""
    old = PostgresTask(ctx, 0)
    old.take_over()
    paused = ctx.pool.getconn()
    paused.execute("BEGIN")
    paused.execute(
        sql.SQL("UPDATE {} SET owner = 'paused' WHERE input_partition = 0").format(
            sql.Identifier(ctx.settings.postgres_schema, "pipeline_offsets")
        )
    )
    started = time.monotonic()
    new = PostgresTask(ctx, 0)
    new.take_over()
    waited = time.monotonic() - started
    assert 0.5 < waited < 5, waited
    assert new.epoch == 2
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # the paused writer wakes up: all gone
        paused.execute("COMMIT")
    ctx.pool.putconn(paused)
    assert table(ctx, "SELECT owner, epoch FROM {s}.pipeline_offsets") == [("test", 2)]
