"""The PostgreSQL runner restores between polls (docs/guarantees.md: restore-keeps-membership): the assignment
callback only fences, p stays paused while its state pages are read in steps of RESTORE_STEP_MS, then the position
is set to the fenced offset before p is resumed. No servers: the database steps of PgWorker are replaced."""

from __future__ import annotations

import contextlib
import time

import pytest
from confluent_kafka import TopicPartition

from pipeline.examples.running_totals_pg import TotalsSink
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.lifecycle import Phase
from pipeline.postgres.runner import PgRunner
from pipeline.postgres.worker import PgWorker, WorkerContext
from pipeline.settings import Settings
from tests.unit.test_runner_take_over import SeekRecordingConsumer

PAGES, PAGE_S = 6, 0.03


@pytest.fixture
def fake_database(monkeypatch) -> list[float]:
    """fence() finds offset 42; the state is PAGES pages of PAGE_S each. Returns when each page was read."""
    pages: list[float] = []

    def fence(self: PgWorker) -> int:
        self.epoch, self.committed_offset = 1, 42
        self.next_offset = 42
        self._transition(Phase.RESTORING)
        return 42

    def read_page(self: PgWorker, conn: object) -> bool:
        time.sleep(PAGE_S)
        pages.append(time.monotonic())
        self.state.load({f"k{len(pages)}": b"[1,1]"})
        return len(pages) == PAGES

    monkeypatch.setattr(PgWorker, "fence", fence)
    monkeypatch.setattr(PgWorker, "_read_page", read_page)
    monkeypatch.setattr(PgWorker, "_check_still_ours", lambda self, conn: None)
    monkeypatch.setattr(PgWorker, "_connection", lambda self: contextlib.nullcontext())
    return pages


def test_the_callback_only_fences_and_the_restore_steps_between_polls(fake_database) -> None:
    settings = Settings(sink="postgres", postgres_dsn="postgresql://unused", restore_step_ms=50)
    runner = PgRunner(totals_pg, settings)
    runner.consumer = consumer = SeekRecordingConsumer()
    runner.ctx = WorkerContext(
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
    worker = runner.workers[0]
    assert worker.phase is Phase.RESTORING and consumer.paused == {0} and fake_database == []

    steps = 0
    while worker.phase is Phase.RESTORING:
        started = time.monotonic()
        runner._advance_restores()
        steps += 1
        assert len([t for t in fake_database if t >= started]) <= 2  # 50 ms: one page past the budget at most
        assert consumer.paused == {0}
    assert steps >= 3 and worker.phase is Phase.REWINDING and len(worker.state) == PAGES

    runner._retry_seeks()
    assert worker.phase is Phase.RUNNING and consumer.paused == set()
    assert consumer.calls == [("seek", 0, 42), ("resume", 0, None)]  # the fenced offset, then resume
