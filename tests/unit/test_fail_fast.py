"""Mistakes fail fast and loud (docs/guarantees.md: fail-fast): a mistake in the App's code that fails every record
the same way stops the partition at once, with an ERROR naming the function, where, and the fix; a failing timer
takes a record's path (retried, dead-lettered with its coordinates, or stopping p); a stopped partition is never
silent; and ON_POISON=stop on the first record a partition ever sees."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import pytest

from pipeline import service
from pipeline.app import App, Output, Record, Reject, State, Timer
from pipeline.core.deadletter import DeadLetter
from pipeline.core.lifecycle import Phase
from pipeline.core.processing import CodeStop, PoisonRecordStop
from pipeline.core.task import DeadLetterStorm
from pipeline.testing.driver import AppDriver, PartitionStopped
from pipeline.testing.oracle import check
from pipeline.testing.oracle.records import KafkaRecord
from tests.harness import DLQ, INPUT, OUTPUT, Harness, msg, poison
from tests.unit.test_processing import pg_task


# -- a wrong return type stops p at once, in both sinks -------------------------------------------------------------
def returning(value: Any) -> App:
    def process(state: State, record: Record) -> Any:
        state["seen"] = True  # undone: p stops before the record
        return value

    return App("wrong", INPUT, OUTPUT, process)


WRONG_RETURNS = {
    "None": (None, "process returned None"),
    "one Output": (Output({"x": 1}), "process returned a single Output"),
    "a tuple": ([("key", {"x": 1})], "process returned a tuple"),
    "a dict": ({"x": 1}, "process returned {'x': 1}"),
}


@pytest.mark.parametrize("name", WRONG_RETURNS)
def test_a_wrong_return_type_stops_the_partition_at_once_naming_process_the_record_and_the_fix(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    value, said = WRONG_RETURNS[name]
    driver = AppDriver(returning(value), processing_max_attempts=5)
    with pytest.raises(PartitionStopped) as stopped:  # the driver's default: the test fails at the call
        driver.send("k", {"x": 1})
    assert driver.tasks[0].phase is Phase.STOPPED
    assert driver.dead_letters == [] and driver.committed_offset() is None and driver.state() == {}
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert said in error.message and "in[0]@0" in error.message
    assert "return a list of Output" in error.message and "STOPPED at its first record" in error.message
    assert str(stopped.value) == error.message  # the runtime's ERROR: the partition, the record, the cause, the fix
    assert isinstance(stopped.value.__cause__, CodeStop) and stopped.value.partition == 0


def test_the_postgres_sink_checks_what_process_returns_on_its_first_attempt() -> None:
    task = pg_task(returning(None), processing_max_attempts=5)
    with pytest.raises(CodeStop, match=r"in\[2\]@10: process returned None"):
        task.process([msg(10)])
    assert task.next_offset == 10 and task.dead_letters == [] and dict(task.state) == {}


def test_one_failing_record_is_still_retried_and_dead_lettered() -> None:
    h = Harness(processing_max_attempts=2)
    task = h.task(committed=10)
    task.process([msg(10), poison(11), msg(12)])
    assert task.next_offset == 13 and len(h.calls.produced(DLQ)) == 1


# -- timers ---------------------------------------------------------------------------------------------------------
def schedule(state: State, record: Record) -> Iterable[Output]:
    state.timers.schedule(record.key, record.value["at"])
    return [Output(record.value)]


def fired(state: State, timer: Timer) -> Iterable[Output]:
    return [Output({"fired": timer.key})]


@pytest.mark.parametrize(
    "app", [App("no-timer", "in", "out", schedule), App("ttl", "in", "out", schedule, state_ttl_ms=9)]
)
def test_a_timer_scheduled_without_on_timer_stops_the_partition_at_once(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    driver = AppDriver(app, processing_max_attempts=5)
    with pytest.raises(PartitionStopped, match="has no on_timer"):
        driver.send("k", {"at": 10})
    assert driver.tasks[0].phase is Phase.STOPPED and driver.dead_letters == []
    assert "has no on_timer" in caplog.text and "give the App on_timer=..." in caplog.text


def test_an_on_timer_returning_the_wrong_type_stops_the_partition_at_once(caplog: pytest.LogCaptureFixture) -> None:
    driver = AppDriver(App("t", "in", "out", schedule, on_timer=lambda state, timer: None), processing_max_attempts=5)
    driver.send("a", {"at": 10}, timestamp_ms=0)
    with pytest.raises(PartitionStopped, match="on_timer returned None"):
        driver.send("b", {"at": 99}, timestamp_ms=10)  # a's timer is due before b
    assert driver.tasks[0].phase is Phase.STOPPED and driver.committed_offset() == 1
    assert "on_timer returned None" in caplog.text and "0:1:stream:10:a" in caplog.text


def test_an_on_timer_that_keeps_failing_is_dead_lettered_with_its_coordinates_and_p_goes_on() -> None:
    def broken(state: State, timer: Timer) -> Iterable[Output]:
        state[f"changed by {timer.key}"] = True  # undone with a failure
        if timer.key == "a":
            raise RuntimeError("bug")
        return [Output({"fired": timer.key})]

    driver = AppDriver(App("t", "in", "out", schedule, on_timer=broken))
    driver.send("a", {"at": 10}, timestamp_ms=0)
    driver.send("b", {"at": 20}, timestamp_ms=10)
    driver.send("c", {"at": 99}, timestamp_ms=20)
    [letter] = driver.dead_letters
    assert (letter.timer, letter.key, letter.error_type, letter.attempts) == (
        "0:1:stream:10:a",
        b"a",
        "RuntimeError",
        3,
    )
    assert (letter.topic, letter.partition, letter.offset) == ("in", 0, 1)  # where it fired: before record 1
    assert [o.value for o in driver.outputs][-2:] == [{"fired": "b"}, {"at": 99}]
    assert driver.tasks[0].phase is Phase.RUNNING and "changed by a" not in driver.state()
    assert [t.key for t in driver.timers()] == ["b", "c"][1:]  # a's entry is gone with its dead letter
    assert driver.verify().ok  # the checker accepts the timer's dead letter in place of its outputs


def test_the_checker_refuses_a_timer_dead_letter_the_reference_does_not_fail() -> None:
    driver = AppDriver(App("t", "in", "out", schedule, on_timer=fired))
    driver.send("a", {"at": 10}, timestamp_ms=0)
    driver.send("b", {"at": 99}, timestamp_ms=10)
    run = driver.run_data()
    letter = DeadLetter("in", 0, 1, b"a", None, "RuntimeError", "bug", 3, timer="0:1:stream:10:a")
    run.dead_letters.records.append(KafkaRecord(0, 0, letter.key, letter.value, tuple(letter.headers()), 0))
    verdict = check(driver.app, run)
    assert "dead-lettered, though its on_timer succeeds" in str(verdict.content)


# -- a stopped partition is never silent -----------------------------------------------------------------------------
def test_run_service_exits_non_zero_once_every_partition_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stopped:
        all_stopped = True

        def install_signal_handlers(self) -> None: ...

        def run(self) -> None: ...

    monkeypatch.setattr(service, "check_app", lambda app, settings: None)
    monkeypatch.setattr(service, "check_connection", lambda settings: None)
    monkeypatch.setattr(service, "runner_for", lambda app, settings: Stopped())
    assert service.run_service(returning(None), None, threading.Event()) == service.PARTITIONS_STOPPED_EXIT  # type: ignore[arg-type]


# -- ON_POISON=stop on the first record a partition ever sees -------------------------------------------------------
def test_a_first_record_that_stops_its_partition_commits_nothing_of_it_and_no_offset() -> None:
    h = Harness(on_poison="stop", processing_max_attempts=2)
    task = h.task(committed=None)  # a new group: no committed offset, no position yet
    with pytest.raises(PoisonRecordStop, match=r"in\[2\]@0 failed 2 times"):
        task.process([poison(0), msg(1)])
    h.commit(task)  # what the runner does before it stops p: nothing of p to commit, and no TypeError
    assert task.next_offset is None and h.calls.produced(DLQ) == []
    assert not [a for name, a, _ in h.calls if name == "send_offsets_to_transaction"]


# -- the dead-letter storm guard --------------------------------------------------------------------------------------
def fails_when(state: State, record: Record) -> Iterable[Output]:
    """A value names how the record fails: "key" -> KeyError, "value" -> ValueError, "reject" -> Reject, else ok."""
    how = record.value
    if how == "key":
        raise KeyError("no such account")
    if how == "value":
        raise ValueError("bad amount")
    if how == "reject":
        raise Reject("late")
    return [Output(how)]


STORMY = App("stormy", "in", "out", fails_when)


def send_all(driver: AppDriver, values: list[str]) -> None:
    for value in values:
        driver.send("k", value)  # one record per call: the guard counts across commits


def test_a_storm_of_one_error_type_stops_the_partition_at_the_nth_failure(caplog: pytest.LogCaptureFixture) -> None:
    driver = AppDriver(STORMY, dead_letter_storm=3, processing_max_attempts=1)
    with pytest.raises(PartitionStopped, match="dead-letter storm") as stopped:
        send_all(driver, ["ok", "key", "key", "key", "key"])
    assert isinstance(stopped.value.__cause__, DeadLetterStorm) and driver.tasks[0].phase is Phase.STOPPED
    assert [d.offset for d in driver.dead_letters] == [1, 2] and driver.committed_offset() == 3
    assert "dead-letter storm: 3 records in a row failed with KeyError (from in[0]@1" in caplog.text
    assert "DEAD_LETTER_STORM=3" in caplog.text and "in[0]@3" in caplog.text


@pytest.mark.parametrize(
    "values",
    [
        ["key", "key", "ok", "key", "key", "ok"],  # a success ends a run
        ["key", "key", "value", "key", "key", "value"],  # so does another error type
        ["key", "key", "reject", "key", "key", "reject"],  # and a Reject, which does not count itself
        ["reject"] * 6,
    ],
)
def test_runs_shorter_than_the_limit_are_dead_lettered_as_usual(values: list[str]) -> None:
    driver = AppDriver(STORMY, dead_letter_storm=3, processing_max_attempts=1)
    send_all(driver, values)
    assert driver.tasks[0].phase is Phase.RUNNING
    assert len(driver.dead_letters) == sum(v != "ok" for v in values)


def test_the_guard_is_off_at_zero_and_on_by_default() -> None:
    driver = AppDriver(STORMY, dead_letter_storm=0, processing_max_attempts=1)
    send_all(driver, ["key"] * 150)
    assert len(driver.dead_letters) == 150 and driver.tasks[0].phase is Phase.RUNNING
    default = AppDriver(STORMY, processing_max_attempts=1)
    with pytest.raises(PartitionStopped, match="DEAD_LETTER_STORM=100 sets"):
        send_all(default, ["key"] * 150)
    assert len(default.dead_letters) == 99 and default.tasks[0].phase is Phase.STOPPED


def test_aborted_transactions_neither_count_their_dead_letters_twice_nor_forget_the_committed_ones() -> None:
    driver = AppDriver(STORMY, dead_letter_storm=3, processing_max_attempts=1, test_abort_every=2)
    send_all(driver, ["key", "key"])  # the second one's transaction aborts, and it is processed again
    assert len(driver.dead_letters) == 2 and driver.tasks[0].phase is Phase.RUNNING
    with pytest.raises(PartitionStopped, match="dead-letter storm: 3 records in a row"):
        send_all(driver, ["key"])
    assert driver.tasks[0].phase is Phase.STOPPED and len(driver.dead_letters) == 2


def test_the_postgres_sink_has_the_same_guard() -> None:
    pg = pg_task(App("stormy", INPUT, OUTPUT, fails_when), dead_letter_storm=3, processing_max_attempts=1)
    with pytest.raises(DeadLetterStorm, match="3 records in a row failed with SerdeError"):
        pg.process([poison(10), poison(11), poison(12), poison(13)])
    assert [d.offset for d in pg.dead_letters] == [10, 11] and pg.next_offset == 12


def test_a_storm_of_failing_timers_stops_the_partition() -> None:
    def broken(state: State, timer: Timer) -> Iterable[Output]:
        raise RuntimeError("bug")

    driver = AppDriver(App("t", "in", "out", schedule, on_timer=broken), dead_letter_storm=3, processing_max_attempts=1)
    with pytest.raises(PartitionStopped, match=r"on_timer\(timer 0:3:stream:2:k2.*dead-letter storm"):
        for i in range(6):  # each record makes the one before's timer due; the records themselves succeed
            driver.send(f"k{i}", {"at": i}, timestamp_ms=i)
    assert driver.tasks[0].phase is Phase.STOPPED and len(driver.dead_letters) == 2
