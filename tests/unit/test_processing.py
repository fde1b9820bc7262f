"""The retry path both sinks share (pipeline/core/processing.py): undo, count, back off doubling, try again, then a dead
letter or PoisonRecordStop; and both sinks giving up on the same record the same way."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pipeline.app import App, Output
from pipeline.core.deadletter import DeadLetter
from pipeline.core.processing import Attempts, PoisonRecordStop
from pipeline.examples.running_totals import app as running_totals
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.task import PostgresTask, PostgresTaskContext
from pipeline.state import PartitionState
from tests.harness import DLQ, INPUT, OUTPUT, Harness, msg, poison


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


def attempts(max_attempts: int = 3, stop: bool = False) -> tuple[Attempts, list[float]]:
    sleeps: list[float] = []
    return Attempts(max_attempts, 0.01, stop, Counter(), Counter(), sleeps.append), sleeps  # type: ignore[arg-type]


def failing_first_attempt(state: PartitionState, error: Exception) -> Exception:
    """What a sink has done when it calls retry: begun the record, let it change the state, caught its error."""
    state.begin_record()
    state["touched"] = "by the failed attempt"
    return error


def test_a_record_that_keeps_failing_becomes_a_dead_letter_after_n_attempts_with_every_attempt_undone() -> None:
    policy, sleeps = attempts(max_attempts=3)
    state = PartitionState()
    state["kept"] = 1
    state.commit()
    tries: list[dict] = []

    def try_once() -> list[Output]:
        tries.append(dict(state))
        state["touched"] = "by a retry"
        raise ValueError(f"attempt {len(tries) + 1}")

    error = failing_first_attempt(state, ValueError("attempt 1"))
    letter = policy.retry(state, poison(11), error, try_once)
    assert tries == [{"kept": 1}, {"kept": 1}]  # each retry saw the state as it was before the record
    assert dict(state) == {"kept": 1} and not state.in_transaction
    assert sleeps == [0.01, 0.02]  # doubling
    assert policy.errors.value == 3 and policy.dead_letters.value == 1
    assert letter == DeadLetter(INPUT, 2, 11, b"acct", b"{not json", "ValueError", "attempt 3", 3)


def test_a_late_success_returns_its_outputs_and_keeps_its_changes() -> None:
    policy, sleeps = attempts(max_attempts=3)
    state = PartitionState()
    error = failing_first_attempt(state, RuntimeError("flaky"))

    def try_once() -> list[str]:
        state["n"] = 1
        return ["out"]

    assert policy.retry(state, msg(0), error, try_once) == ["out"]
    assert dict(state) == {"n": 1} and sleeps == [0.01]
    assert policy.errors.value == 1 and policy.dead_letters.value == 0


def test_stop_mode_raises_after_the_last_attempt_with_the_state_undone() -> None:
    policy, sleeps = attempts(max_attempts=2, stop=True)
    state = PartitionState()
    error = failing_first_attempt(state, ValueError("bad"))
    with pytest.raises(PoisonRecordStop, match=r"in\[2\]@11 failed 2 times: KeyError: 'x'") as stopped:
        policy.retry(state, poison(11), error, lambda: {}["x"])
    assert isinstance(stopped.value.__cause__, KeyError)
    assert dict(state) == {} and len(sleeps) == 1 and policy.dead_letters.value == 0


def test_one_attempt_in_all_gives_up_at_once_without_sleeping() -> None:
    policy, sleeps = attempts(max_attempts=1)
    state = PartitionState()
    letter = policy.retry(state, poison(3), failing_first_attempt(state, ValueError("x")), lambda: pytest.fail())
    assert isinstance(letter, DeadLetter) and letter.attempts == 1 and sleeps == [] and dict(state) == {}


# -- both sinks -----------------------------------------------------------------------------------------------------
def pg_task(app: App = running_totals, **settings: object) -> PostgresTask:
    """A PostgreSQL task that only processes (no database is touched before commit)."""
    config = Settings(**{"processing_backoff_ms": 0, **settings})
    ctx = PostgresTaskContext(app, config, "unit", INPUT, pool=None, sink=None, metrics=Metrics(), owner="unit")  # type: ignore[arg-type]
    task = PostgresTask(ctx, 2)
    task.next_offset = 10
    return task


def kafka_dead_letters(h: Harness) -> list[DeadLetter]:
    return [DeadLetter.from_record(r["key"], r["value"], r["headers"]) for r in h.calls.produced(DLQ)]


def test_both_sinks_dead_letter_the_same_record_the_same_way_and_go_on() -> None:
    h = Harness(processing_max_attempts=3)
    task = h.task(committed=10)
    pg = pg_task(processing_max_attempts=3)
    batch = [msg(10, amount=4), poison(11), msg(12, amount=6)]
    task.process(batch)
    pg.process(batch)
    assert kafka_dead_letters(h) == pg.dead_letters
    [letter] = pg.dead_letters
    assert (letter.offset, letter.error_type, letter.attempts) == (11, "SerdeError", 3)
    assert dict(task.state) == dict(pg.state) == {"acct": [2, 10]}  # the poison record changed nothing
    assert task.next_offset == pg.next_offset == 13  # past the record: its dead letter commits with the offset
    assert [row.offset for row in pg.rows] == [10, 12]
    assert len(h.calls.produced(OUTPUT)) == 2


def test_both_sinks_stop_at_the_poison_record_in_stop_mode() -> None:
    h = Harness(on_poison="stop", processing_max_attempts=2)
    task = h.task(committed=10)
    pg = pg_task(on_poison="stop", processing_max_attempts=2)
    for sink in (task, pg):
        with pytest.raises(PoisonRecordStop, match=r"in\[2\]@11 failed 2 times: SerdeError"):
            sink.process([msg(10), poison(11), msg(12)])
        assert sink.next_offset == 11 and dict(sink.state) == {"acct": [1, 1]}
    assert pg.dead_letters == [] and h.calls.produced(DLQ) == []


def test_a_business_error_in_either_sink_is_retried_then_dead_lettered_with_its_type() -> None:
    def fails(state, record) -> Iterable[Output]:
        state["seen"] = True
        raise LookupError("no such account")

    app = App("fails", INPUT, OUTPUT, fails)
    h = Harness(app=app, processing_max_attempts=2)
    task = h.task(committed=10)
    pg = pg_task(app, processing_max_attempts=2)
    task.process([msg(10)])
    pg.process([msg(10)])
    assert kafka_dead_letters(h) == pg.dead_letters
    [letter] = pg.dead_letters
    assert (letter.error_type, letter.error_message, letter.attempts) == ("LookupError", "no such account", 2)
    assert dict(task.state) == dict(pg.state) == {}
