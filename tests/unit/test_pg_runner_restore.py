"""The PostgreSQL runner restores between polls (docs/guarantees.md: restore-keeps-membership): the assignment
callback only fences, p stays paused while its state pages are read in steps of RESTORE_STEP_MS, then the position
is set to the fenced offset before p is resumed. No servers: the database steps of PostgresTask are replaced."""

from __future__ import annotations

import contextlib
import time

import pytest
from confluent_kafka import TopicPartition

from pipeline.core.lifecycle import Phase
from pipeline.examples.running_totals_pg import TotalsSink
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.settings import Settings
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.sinks.postgres.task import PostgresTask, PostgresTaskContext
from tests.fakes import FakeConsumer

PAGES, PAGE_S = 6, 0.03


@pytest.fixture
def fake_database(monkeypatch) -> list[float]:
    """fence() finds offset 42; the state is PAGES pages of PAGE_S each. Returns when each page was read."""
    pages: list[float] = []

    def fence(self: PostgresTask) -> int:
        self.epoch, self.committed_offset = 1, 42
        self.next_offset = 42
        self._transition(Phase.RESTORING)
        return 42

    def read_page(self: PostgresTask, conn: object) -> bool:
        time.sleep(PAGE_S)
        pages.append(time.monotonic())
        self.state.load({f"k{len(pages)}": b"[1,1]"})
        return len(pages) == PAGES

    monkeypatch.setattr(PostgresTask, "fence", fence)
    monkeypatch.setattr(PostgresTask, "_read_page", read_page)
    monkeypatch.setattr(PostgresTask, "_check_still_ours", lambda self, conn: None)
    monkeypatch.setattr(PostgresTask, "connection", lambda self: contextlib.nullcontext())
    return pages


def test_the_callback_only_fences_and_the_restore_steps_between_polls(fake_database) -> None:
    settings = Settings(sink="postgres", postgres_dsn="postgresql://unused", restore_step_ms=50)
    runner = PostgresRunner(totals_pg, settings)
    runner.consumer = consumer = FakeConsumer()
    runner.ctx = PostgresTaskContext(
        totals_pg,
        settings,
        "unit",
        totals_pg.input_topic,
        None,
        TotalsSink(),  # type: ignore[arg-type]
        runner.metrics,
        "unit",
    )
    runner._on_assign(consumer, [TopicPartition(totals_pg.input_topic, 0)])
    task = runner.tasks[0]
    assert task.phase is Phase.RESTORING and consumer.paused == {0} and fake_database == []

    steps = 0
    while task.phase is Phase.RESTORING:
        started = time.monotonic()
        runner._advance_restores()
        steps += 1
        assert len([t for t in fake_database if t >= started]) <= 2  # 50 ms: one page past the budget at most
        assert consumer.paused == {0}
    assert steps >= 3 and task.phase is Phase.REWINDING and len(task.state) == PAGES

    runner._retry_seeks()
    assert task.phase is Phase.RUNNING and consumer.paused == set()
    assert consumer.moves() == [("seek", 0, 42), ("resume", 0, None)]  # the fenced offset, then resume
