"""Timers and state TTL (docs/guarantees.md: timers-exactly-once): the state that keeps them, their firing through the
task (the test driver runs KafkaTask with in-memory clients), and the checker that proves them exactly once."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pipeline.app import App, Output, Record, Reject, State, Timer
from pipeline.core.lifecycle import Phase
from pipeline.core.provenance import TimerSource
from pipeline.examples.windowed_totals import app as windowed
from pipeline.state import PartitionState
from pipeline.state.disk_store import ready_state
from pipeline.state.timed import STREAM_TIME_KEY, TimedState
from pipeline.testing.driver import AppDriver, PartitionStopped
from pipeline.testing.oracle import RunData, TopicDump, check
from pipeline.testing.oracle.records import KafkaRecord
from tests.unit.conftest import make_state, make_timed

pytestmark = pytest.mark.usefixtures("state_store")  # the state and drivers on both stores (tests/unit/conftest.py)


# -- the state ---------------------------------------------------------------------------------------------------
def fire_all(state: TimedState, clock: str, now_ms: int) -> list[Timer | None]:
    fired = []
    while (due := state.pop_due(clock, now_ms)) is not None:
        state.begin_record()
        fired.append(state.remove(due))
    return fired


def test_due_timers_come_by_time_then_key_and_a_second_schedule_moves_the_timer() -> None:
    state = make_timed()
    state.timers.schedule("b", 20)
    state.timers.schedule("a", 20, payload={"n": 1})
    state.timers.schedule("c", 10)
    state.timers.schedule("c", 30)  # moved later
    state.timers.schedule("d", 40)
    state.timers.schedule("d", 15)  # moved earlier
    assert state.timers.cancel("b") and not state.timers.cancel("b")
    assert fire_all(state, "stream", 30) == [Timer("d", 15), Timer("a", 20, {"n": 1}), Timer("c", 30)]
    assert fire_all(state, "stream", 10**12) == [] and list(state.timers) == []


def test_an_undone_firing_fires_again_and_stream_time_comes_back() -> None:
    state = make_timed()
    state.advance_stream_time(5)
    state.timers.schedule("t", 10, payload="p")
    state.commit()
    state.advance_stream_time(12)
    assert fire_all(state, "stream", 12) == [Timer("t", 10, "p")]
    state.undo_transaction()  # the transaction with the firing aborted
    assert state.stream_time_ms == 5 and state.timers.get("t") == Timer("t", 10, "p")
    assert fire_all(state, "stream", 12) == [Timer("t", 10, "p")]


def test_reserved_keys_are_hidden_from_the_user_and_cannot_be_written() -> None:
    state = make_timed(ttl_ms=100)
    state.advance_stream_time(1)
    state["k"] = 1
    state.timers.schedule("t", 5)
    assert dict(state) == {"k": 1} and len(state) == 1
    assert sorted(key for key, _ in state.encoded_items()) == [
        STREAM_TIME_KEY,
        "__eos.timer.stream/t",
        "__eos.ttl/k",
        "k",
    ]
    with pytest.raises(ValueError, match="reserved"):
        state["__eos.mine"] = 1


def test_a_ttl_deadline_is_rounded_up_to_the_granularity_and_written_only_when_it_moves_to_a_later_bucket() -> None:
    state = make_timed(ttl_ms=100, ttl_granularity_ms=1_000)
    state.advance_stream_time(0)
    state["k"] = 1
    assert dict(state.changes())["__eos.ttl/k"] == b"1000"  # 0 + 100, rounded up
    state.commit()
    for now in (450, 900):  # 550 and 1000: the same bucket, nothing written
        state.advance_stream_time(now)
        state["k"] = now
        assert "__eos.ttl/k" not in dict(state.changes()) and "__eos.ttl/k" not in state._before_txn  # not touched
    state.commit()
    state.advance_stream_time(901)  # 1001: the next bucket
    state["k"] = 2
    assert dict(state.changes())["__eos.ttl/k"] == b"2000"
    assert fire_all(state, "stream", 1_999) == [] and state["k"] == 2  # never earlier than ttl_ms after a write
    assert fire_all(state, "stream", 2_000) == [None] and "k" not in state  # at most a bucket later


def test_a_ttl_granularity_needs_a_ttl_and_is_not_negative() -> None:
    def count(state: State, record: Record) -> Iterable[Output]:
        return []

    with pytest.raises(ValueError, match="state_ttl_granularity_ms"):
        App("g", "in", "out", count, state_ttl_granularity_ms=1_000)
    with pytest.raises(ValueError, match="state_ttl_granularity_ms"):
        App("g", "in", "out", count, state_ttl_ms=1_000, state_ttl_granularity_ms=-1)


def test_a_restored_state_is_adopted_with_its_timers_queued() -> None:
    written = TimedState()
    written.advance_stream_time(7)
    written.timers.schedule("w", 1_000, clock="wall")
    written.timers.schedule("s", 9, payload=[1])
    restored = make_state()
    restored.load(dict(written.encoded_items()))  # what the restore hands the task
    state = ready_state(App("t", "in", "out", lambda s, r: [], on_timer=lambda s, t: []), restored, "p0")
    assert isinstance(state, TimedState)
    assert state.stream_time_ms == 7
    assert fire_all(state, "stream", 9) == [Timer("s", 9, [1])]
    assert fire_all(state, "wall", 999) == [] and fire_all(state, "wall", 1_000) == [Timer("w", 1_000, clock="wall")]


# -- firing through the task ---------------------------------------------------------------------------------------
def schedule_each(state: State, record: Record) -> Iterable[Output]:
    """Each record schedules a timer named by its key, due at its value, with the record's id as payload."""
    state.timers.schedule(
        record.key, record.value["at"], payload=record.value["id"], clock=record.value.get("clock", "stream")
    )
    return (Output(key=record.key, value={"record": record.value["id"]}),)


def fired(state: State, timer: Timer) -> Iterable[Output]:
    state["fired"] = state.get("fired", 0) + 1
    return (Output(key=timer.key, value={"timer": timer.payload, "at": timer.at_ms}),)


TIMED = App("timed", "in", "out", schedule_each, on_timer=fired)


def test_a_stream_timer_fires_before_the_record_that_moves_stream_time_past_it() -> None:
    driver = AppDriver(TIMED)
    driver.send("a", {"id": 1, "at": 150}, timestamp_ms=100)
    assert driver.send("x", {"id": 2, "at": 10**9}, timestamp_ms=149) == driver.outputs[-1:]  # not due yet
    out = driver.send("y", {"id": 3, "at": 10**9}, timestamp_ms=150)
    assert [o.value for o in out] == [{"timer": 1, "at": 150}, {"record": 3}]
    assert out[0].timer == TimerSource(0, 2, "stream", 150, "a") and out[0].source is None
    assert out[1].source == (0, 2)
    driver.send("z", {"id": 4, "at": 1}, timestamp_ms=120)  # due in the past: fires before the next record
    assert [o.value for o in driver.send("q", {"id": 5, "at": 10**9}, timestamp_ms=0)] == [
        {"timer": 4, "at": 1},
        {"record": 5},
    ]
    assert driver.state() == {"fired": 2} and driver.verify().ok


def test_a_wall_clock_timer_fires_on_the_poll_loop_once_even_across_a_crash() -> None:
    driver = AppDriver(TIMED, wall_clock_ms=1_000, auto_commit=False)
    driver.send("w", {"id": 1, "at": 1_500, "clock": "wall"})
    driver.commit()
    assert driver.advance_wall_clock(499) == []
    assert [o.value for o in driver.advance_wall_clock(1)] == [{"timer": 1, "at": 1_500}]
    driver.crash()  # the firing was not committed: it happens again, once
    driver.commit()
    assert [o.value for o in driver.outputs] == [{"record": 1}, {"timer": 1, "at": 1_500}]
    driver.crash()
    driver.advance_wall_clock(10_000)
    assert len(driver.outputs) == 2 and driver.timers() == [] and driver.state() == {"fired": 1}
    assert driver.verify().ok


def test_a_burst_of_due_timers_fires_at_most_timers_per_turn_per_loop_turn_then_the_record() -> None:
    since_tick, per_turn = [0], []

    def counting(state: State, timer: Timer) -> Iterable[Output]:
        since_tick[0] += 1
        return fired(state, timer)

    driver = AppDriver(App("burst", "in", "out", schedule_each, on_timer=counting), timers_per_turn=10)
    for i in range(35):
        driver.send(f"k{i:02}", {"id": i, "at": 1_000 + i % 3}, timestamp_ms=0)
    task = driver.tasks[0]
    tick = task.tick

    def counting_tick(now_ms: int) -> None:
        per_turn.append(since_tick[0])
        since_tick[0] = 0
        tick(now_ms)

    task.tick = counting_tick  # type: ignore[method-assign]
    out = driver.send("last", {"id": 99, "at": 10**9}, timestamp_ms=5_000)
    assert per_turn + since_tick == [10, 10, 10, 5]  # firings per loop turn: spread over turns
    expected = sorted((1_000 + i % 3, f"k{i:02}") for i in range(35))
    assert [(o.value["at"], o.key) for o in out[:-1]] == expected and out[-1].value == {"record": 99}
    assert not driver.consumer.paused and driver.verify().ok  # p fetched again after the burst


def test_an_on_timer_that_keeps_failing_stops_the_partition_before_the_record_with_on_poison_stop() -> None:
    def broken(state: State, timer: Timer) -> Iterable[Output]:
        raise RuntimeError("bug")

    driver = AppDriver(App("broken", "in", "out", schedule_each, on_timer=broken), on_poison="stop")
    driver.send("a", {"id": 1, "at": 10}, timestamp_ms=0)
    with pytest.raises(PartitionStopped, match=r"on_timer\(timer 0:1:stream:10:a .* failed 3 times: RuntimeError"):
        driver.send("b", {"id": 2, "at": 10**9}, timestamp_ms=10)
    assert driver.tasks[0].phase is Phase.STOPPED
    assert driver.committed_offset() == 1 and [o.value for o in driver.outputs] == [{"record": 1}]


# -- TTL -----------------------------------------------------------------------------------------------------------
def count(state: State, record: Record) -> Iterable[Output]:
    state[record.key] = state.get(record.key, 0) + 1
    return (Output(key=record.key, value=state[record.key]),)


def test_stream_ttl_expires_a_key_not_written_for_that_long_and_survives_a_restore() -> None:
    driver = AppDriver(App("ttl", "in", "out", count, state_ttl_ms=1_000))
    driver.send("a", 0, timestamp_ms=0)
    driver.send("b", 0, timestamp_ms=500)
    driver.send("a", 0, timestamp_ms=900)  # a's deadline moves to 1900
    driver.crash()  # restored from the changelog: deadlines included
    assert [o.value for o in driver.send("b", 0, timestamp_ms=1_500)] == [1]  # b expired at 1500: counts anew
    assert driver.state() == {"a": 2, "b": 1}
    driver.send("c", 0, timestamp_ms=1_900)
    assert driver.state() == {"b": 1, "c": 1}
    changelog = [(r.key, r.value) for r in driver.broker.committed_records(driver.changelog_topic)]
    assert (b"a", None) in changelog  # the expiry is a tombstone, committed in a transaction
    driver.crash()
    assert driver.state() == {"b": 1, "c": 1} and driver.verify().ok


def test_wall_clock_ttl_reads_as_absent_once_due_and_is_deleted_on_the_next_turn() -> None:
    driver = AppDriver(
        App("wall-ttl", "in", "out", count, state_ttl_ms=1_000, state_ttl_clock="wall"), auto_commit=False
    )
    driver.send("a", 0)
    state = driver.tasks[0].state
    driver.now_ms = 1_000
    assert "a" not in state and state.get("a") is None  # expired, not yet deleted
    driver.advance_wall_clock(0)
    assert dict(state.encoded_items()).keys() == {STREAM_TIME_KEY}


# -- Reject: a dead letter on purpose ------------------------------------------------------------------------------
def test_reject_dead_letters_at_once_with_its_error_type_even_with_on_poison_stop() -> None:
    def reject_odd(state: State, record: Record) -> Iterable[Output]:
        state["seen"] = state.get("seen", 0) + 1
        if record.value % 2:
            raise Reject("odd", f"{record.value} is odd")
        return (Output(key=record.key, value=record.value),)

    driver = AppDriver(App("reject", "in", "out", reject_odd), on_poison="stop", processing_max_attempts=5)
    for n in (2, 3, 4):
        driver.send("k", n)
    [letter] = driver.dead_letters
    assert (letter.offset, letter.error_type, letter.error_message, letter.attempts, letter.rejected) == (
        1,
        "odd",
        "3 is odd",
        1,
        True,
    )
    assert driver.state() == {"seen": 2} and driver.tasks[0].phase is Phase.RUNNING
    assert driver.verify().ok


# -- the checker -----------------------------------------------------------------------------------------------------
def windowed_run(crash_every: int, records: int = 3_000) -> AppDriver:
    driver = AppDriver(windowed, partitions=3, auto_commit=False)
    for i, (p, key, value, ts) in enumerate(windowed.generate(records, 3, 4)):
        driver.send_bytes(key, value, timestamp_ms=ts, partition=p)
        if i % 40 == 39:
            driver.commit()
        if i % crash_every == crash_every - 1:
            driver.crash()
    return driver


def test_windows_are_exactly_once_across_crashes_between_schedule_and_fire() -> None:
    verdict = windowed_run(crash_every=173).verify()
    assert verdict.ok, verdict.summary()


def test_the_checker_fails_a_run_whose_timers_were_not_in_the_transaction(monkeypatch) -> None:
    """Timer entries left out of the changelog (so outside the transaction): after a crash the restored state has
    no timers, windows never close, and the checker says so."""
    changes = PartitionState.changes
    monkeypatch.setattr(
        PartitionState, "changes", lambda self: ((k, v) for k, v in changes(self) if not k.startswith("__eos.timer"))
    )
    verdict = windowed_run(crash_every=173).verify()
    assert not verdict.ok and verdict.losses.count > 0 and verdict.state.count > 0


def _timer_output(p: int, offset: int, firing: bytes, value: bytes) -> KafkaRecord:
    return KafkaRecord(p, offset, b"w", value, (("eos.timer", firing),))


def test_the_checker_places_wall_clock_firings_where_the_run_says_and_finds_a_second_one() -> None:
    app = App("timed", "in", "out", schedule_each, on_timer=fired)
    driver = AppDriver(app, wall_clock_ms=0)
    driver.send("w", {"id": 1, "at": 100, "clock": "wall"})
    driver.advance_wall_clock(100)
    run = driver.run_data()
    assert check(app, run).ok
    again = _timer_output(0, len(run.outputs.records), b"0:7:wall:100:w", b'{"timer":1,"at":100}')
    doubled = RunData(
        run.input_topic,
        run.inputs,
        TopicDump("out", [*run.outputs.records, again], {0: len(run.outputs.records) + 1}),
        run.dead_letters,
        run.changelog,
        run.committed,
    )
    verdict = check(app, doubled)
    assert verdict.duplicates.count == 1 and "no such wall-clock timer is pending" in str(verdict.duplicates.samples)


def test_the_postgresql_sink_refuses_an_app_with_timers_or_ttl() -> None:
    from pipeline import settings as settings_module
    from pipeline.sinks.postgres.runner import PostgresRunner

    settings = settings_module.load(env={}, sink="postgres", postgres_dsn="postgresql://unused/db")
    with pytest.raises(settings_module.ConfigError, match="Kafka-mode only"):
        PostgresRunner(windowed, settings)
