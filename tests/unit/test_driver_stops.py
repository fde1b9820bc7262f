"""The driver fails where the runtime stops (pipeline/testing/stops.py): a partition stopped as the runtime stops it
(docs/guarantees.md: fail-fast) raises PartitionStopped from the call that stopped it, with the runtime's message
and the original error as its cause; `verify()` is not ok while a partition is stopped; on_stop="record" keeps the
runtime's behaviour for a test about the stop itself; a dead-lettered record is no stop."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from pipeline.app import App, Output, Record, Reject, State, Timer
from pipeline.core.lifecycle import Phase
from pipeline.core.processing import CodeStop, PoisonRecordStop
from pipeline.state.versions import StateVersionError
from pipeline.testing.driver import AppDriver, PartitionStopped
from pipeline.testing.pytest_plugin import pipeline_driver  # noqa: F401 - the fixture, as users import it
from tests.snapshots.versioned_app import v1, v2


def echo(state: State, record: Record) -> Iterable[Output]:
    return [Output(record.value)]


def broken(state: State, record: Record) -> Any:
    """Forgets its return for "bad" (the mistake of issue 31): every record like it fails the same way."""
    if record.value == "bad":
        return None
    return [Output(record.value)]


def wall_timer(state: State, record: Record) -> Iterable[Output]:
    state.timers.schedule(record.key, 1_000, clock="wall")
    return []


BROKEN = App("broken", "in", "out", broken)
WALL = App("wall", "in", "out", wall_timer, on_timer=lambda state, timer: None)  # on_timer forgets its return
GLOBAL = App("global", "in", "out", broken, global_tables={"accounts": "accounts"})


def breaks_the_second_time() -> Callable[[State, Record], Any]:
    calls = []

    def process(state: State, record: Record) -> Any:
        calls.append(record.offset)
        return None if len(calls) > 2 else [Output(record.value)]

    return process


def pending(driver: AppDriver) -> None:
    driver.produce("k", "bad")  # appended, not processed yet: the next call that runs the loop processes it


# Each call that runs the loop: (the App, what comes before, the call).
CALLS: dict[str, tuple[Callable[[], App], Callable[[AppDriver], Any], Callable[[AppDriver], Any]]] = {
    "send": (lambda: BROKEN, lambda d: None, lambda d: d.send("k", "bad")),
    "send_bytes": (lambda: BROKEN, lambda d: None, lambda d: d.send_bytes(b"k", b'"bad"')),
    "run": (lambda: BROKEN, pending, lambda d: d.run()),
    "advance_wall_clock": (lambda: WALL, lambda d: d.send("k", "x"), lambda d: d.advance_wall_clock(1_000)),
    "update_table": (lambda: GLOBAL, pending, lambda d: d.update_table("accounts", "a", {"desk": 1})),
    "crash": (lambda: BROKEN, pending, lambda d: d.crash()),
    "deploy": (lambda: App("broken", "in", "out", echo), pending, lambda d: d.deploy(BROKEN)),
    # auto_commit=False and TEST_ABORT_EVERY=2: the second transaction aborts in commit(), which processes its record
    # again, and the code breaks on that attempt
    "commit": (
        lambda: App("flaky", "in", "out", breaks_the_second_time()),
        lambda d: (d.send("k", "first"), d.commit(), d.send("k", "second")),
        lambda d: d.commit(),
    ),
}


@pytest.mark.parametrize("call", CALLS)
def test_a_broken_process_fails_the_test_from_the_call_that_stopped_the_partition(
    call: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, before, stopping = CALLS[call]
    driver = AppDriver(app(), auto_commit=call != "commit", test_abort_every=2 if call == "commit" else 0)
    before(driver)
    with pytest.raises(PartitionStopped) as stopped:
        stopping(driver)
    stop = stopped.value
    assert isinstance(stop.__cause__, CodeStop) and stop.error is stop.__cause__
    assert stop.partition == 0 and driver.tasks[0].phase is Phase.STOPPED and driver.stopped == {0: stop}
    [error] = [r.message for r in caplog.records if r.levelno == logging.ERROR]
    assert str(stop) == error  # the runtime's ERROR: where, the cause and the fix
    message = str(stop)
    assert message.startswith("p0: STOPPED at ") and "returned None" in message and "Fix it: return a list" in message


def test_the_message_names_the_partition_the_offset_the_topic_the_cause_and_the_fix() -> None:
    driver = AppDriver(BROKEN, partitions=2)
    driver.send("k", "ok", partition=1)
    with pytest.raises(PartitionStopped) as stopped:
        driver.send("k", "bad", partition=1)
    assert (stopped.value.partition, stopped.value.position) == (1, 1)
    assert str(stopped.value).startswith("p1: STOPPED at offset 1: in[1]@1: process returned None")
    assert "Fix it: return a list of Output" in stopped.value.fix


def test_the_call_finishes_its_work_before_it_raises() -> None:
    """The same committed data as the runtime's: what came before the record, and the other partitions' records."""
    driver = AppDriver(BROKEN, partitions=2)
    driver.produce("a", "ok 0", partition=0)
    driver.produce("a", "bad", partition=0)
    driver.produce("b", "ok 1", partition=1)
    with pytest.raises(PartitionStopped, match="p0: STOPPED at offset 1"):
        driver.run()
    assert [o.value for o in driver.outputs] == ["ok 0", "ok 1"]
    assert (driver.committed_offset(0), driver.committed_offset(1)) == (1, 1)
    assert driver.send("b", "ok 2", partition=1)[0].value == "ok 2"  # p1 goes on; p0 stays stopped, silently
    assert driver.stopped.keys() == {0}


def test_two_partitions_stopped_by_one_call_are_both_told() -> None:
    driver = AppDriver(BROKEN, partitions=2)
    driver.produce("a", "bad", partition=0)
    driver.produce("b", "bad", partition=1)
    with pytest.raises(PartitionStopped, match="p0: STOPPED") as stopped:
        driver.run()
    assert [note[:15] for note in stopped.value.__notes__] == ["also: p1: STOPP"]
    assert driver.stopped.keys() == {0, 1}


def test_verify_fails_while_a_partition_is_stopped_and_passes_once_fixed_code_took_it_over() -> None:
    driver = AppDriver(BROKEN, on_stop="record")
    driver.send("k", "ok")
    assert driver.send("k", "bad") == []  # the runtime's behaviour: an ERROR, p paused, nothing raised
    assert driver.send("k", "ok again") == []  # stopped: nothing from the bad record on is processed
    assert driver.tasks[0].phase is Phase.STOPPED and isinstance(driver.stopped[0].__cause__, CodeStop)
    verdict = driver.verify()
    [stop] = [str(problem) for problem in verdict.losses.samples if problem.where == "stopped p0"]
    assert not verdict.ok and stop.startswith("stopped p0: p0: STOPPED at offset 1: in[0]@1: process returned None")
    driver.deploy(App("broken", "in", "out", echo))  # the fix: the new owner processes from the bad record on
    assert driver.stopped == {} and driver.verify().ok
    assert [o.value for o in driver.outputs] == ["ok", "bad", "ok again"]


def test_verify_fails_after_a_raised_stop_too() -> None:
    driver = AppDriver(BROKEN)
    with pytest.raises(PartitionStopped):
        driver.send("k", "bad")
    assert "stopped p0" in [problem.where for problem in driver.verify().losses.samples]


def test_a_take_over_with_the_same_code_stops_again_at_the_same_record() -> None:
    driver = AppDriver(BROKEN)
    driver.send("k", "ok")
    with pytest.raises(PartitionStopped, match="offset 1"):
        driver.send("k", "bad")
    with pytest.raises(PartitionStopped, match="offset 1"):
        driver.crash()  # as the runtime restarted: the same record, the same mistake


def test_dead_lettered_records_are_no_stop() -> None:
    def fails(state: State, record: Record) -> Iterable[Output]:
        if record.value == "reject":
            raise Reject("rejected")
        raise KeyError("no such account")

    driver = AppDriver(App("fails", "in", "out", fails), processing_max_attempts=2)
    assert driver.send_bytes(b"k", b"not json") == []  # poison: dead-lettered
    assert driver.send("k", "missing") == []  # raises every attempt: dead-lettered
    assert driver.send("k", "reject") == []  # a dead letter on purpose
    assert [d.error_type for d in driver.dead_letters] == ["SerdeError", "KeyError", "rejected"]
    assert driver.stopped == {} and driver.tasks[0].phase is Phase.RUNNING and driver.verify().ok


def test_a_poison_record_with_on_poison_stop_raises() -> None:
    driver = AppDriver(App("echo", "in", "out", echo), on_poison="stop", processing_max_attempts=2)
    driver.send("k", "ok")
    with pytest.raises(PartitionStopped, match=r"p0: STOPPED at offset 1: in\[0\]@1 failed 2 times: SerdeError") as s:
        driver.send_bytes(b"k", b"not json")
    assert type(s.value.__cause__) is PoisonRecordStop and driver.dead_letters == []


def test_a_timer_failing_with_on_poison_stop_raises() -> None:
    def failing(state: State, timer: Timer) -> Iterable[Output]:
        raise RuntimeError("bug")

    driver = AppDriver(App("wall", "in", "out", wall_timer, on_timer=failing), on_poison="stop")
    driver.send("k", "x")
    with pytest.raises(PartitionStopped, match=r"on_timer\(timer 0:1:wall:1000:k .* failed 3 times: RuntimeError"):
        driver.advance_wall_clock(1_000)


def test_state_of_a_newer_version_raises_from_the_deploy_in_both_modes() -> None:
    for on_stop, raised in (("raise", PartitionStopped), ("record", StateVersionError)):
        driver = AppDriver(v2, on_stop=on_stop)  # type: ignore[arg-type]
        driver.send("a", 1)
        with pytest.raises(raised, match="written by state version 2, this code is at version 1"):
            driver.deploy(v1)  # a rollback: the runtime's process ends at the restore


def test_an_unknown_on_stop_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"on_stop='ignore': one of 'raise', 'record'"):
        AppDriver(BROKEN, on_stop="ignore")  # type: ignore[arg-type]


def test_the_pytest_plugin_fixture_raises_and_can_record(pipeline_driver) -> None:  # noqa: F811
    with pytest.raises(PartitionStopped, match="process returned None"):
        pipeline_driver(BROKEN).send("k", "bad")
    recording = pipeline_driver(BROKEN, on_stop="record")
    assert recording.send("k", "bad") == [] and recording.stopped.keys() == {0} and not recording.verify().ok
