"""Several inputs and tables (docs/inputs.md) through the test driver and on fakes, no broker: the App's model, the
timestamp merge and its bounded wait, a co-partitioned table updated in order and undone with an abort, the
checkpoint that names the order taken, and the checker that replays it."""

from __future__ import annotations

import time
import types
from collections.abc import Iterable

import pytest
from confluent_kafka import TopicPartition

from pipeline.app import App, Output, Record, Reject, State, Stream, Table
from pipeline.core.lifecycle import Phase
from pipeline.sinks.kafka import inputs as inputs_module
from pipeline.sinks.kafka.inputs import MultiInputTask
from pipeline.state.changelog import Checkpoint, order_runs
from pipeline.testing.driver import AppDriver

TRADES, LIMITS = "limits-trades", "limits-limits"


def process(state: State, record: Record) -> Iterable[Output]:
    """Positions per account against a co-partitioned table of limits."""
    limit = state.tables["limits"].get(record.key)
    position = state.get(record.key, 0) + record.value["qty"]
    if limit is not None and position > limit:
        raise Reject("over_limit", f"{record.key}: {position} > {limit}")
    state[record.key] = position
    return [Output(key=record.key, value={"position": position, "limit": limit}, partition=record.partition)]


limits = App(
    name="limits",
    inputs=[Stream(TRADES)],
    output_topic="limits-out",
    process=process,
    tables={"limits": Table(LIMITS)},
)


def trade(d: AppDriver, qty: int, ts: int, key: str = "a") -> None:
    d.produce(key, {"qty": qty}, topic=TRADES, timestamp_ms=ts)


def limit(d: AppDriver, value: int | None, ts: int, key: str = "a") -> None:
    d.produce(key, None if value is None else value, topic=LIMITS, timestamp_ms=ts)


# -- the model ------------------------------------------------------------------------------------------------------
def test_a_one_input_app_is_one_stream_with_its_serdes() -> None:
    app = App("x", "in", "out", process)
    assert app.streams == (Stream("in"),) and not app.multi_input and app.co_partitioned == ("in",)


def test_several_inputs_tables_and_global_tables_are_named_once() -> None:
    app = App("x", output_topic="out", process=process, inputs=["a", "b"], tables={"t": "c"}, global_tables={"g": "d"})
    assert app.input_topic == "a" and app.co_partitioned == ("a", "b", "c") and app.multi_input
    with pytest.raises(ValueError, match="not the first of inputs"):
        App("x", "z", "out", process, inputs=["a", "b"])
    with pytest.raises(ValueError, match="named twice"):
        App("x", output_topic="out", process=process, inputs=["a"], tables={"t": "a"})
    with pytest.raises(ValueError, match="stateful=True"):
        App("x", output_topic="out", process=process, inputs=["a"], tables={"t": "b"}, stateful=False)


def test_topic_suffix_renames_every_topic_and_record_topic_keeps_the_declared_name() -> None:
    app = limits.configured(topic_suffix="-s1")
    assert app.co_partitioned == (TRADES + "-s1", LIMITS + "-s1") and app.output_topic == "limits-out-s1"
    assert app.decode(b"a", b'{"qty": 1}', TRADES + "-s1", 0, 0).topic == TRADES
    with pytest.raises(ValueError, match="INPUT_TOPIC"):
        limits.configured(input_topic="other")


def test_a_checkpoint_names_every_topic_and_the_order_and_reads_the_old_format() -> None:
    checkpoint = Checkpoint("a", 0, 5, {"a": 5, "b": 2}, "0:3,1:2,0:2")
    assert Checkpoint.decode(checkpoint.encode()) == checkpoint
    assert order_runs(checkpoint.order) == [(0, 3), (1, 2), (0, 2)]
    legacy = Checkpoint.decode(b'{"topic": "a", "partition": 0, "next_offset": 7}')
    assert legacy.covers() == {"a": 7} and legacy.encode() == Checkpoint("a", 0, 7).encode()


# -- a co-partitioned table -----------------------------------------------------------------------------------------
def test_a_table_update_counts_for_the_records_after_it_in_timestamp_order() -> None:
    d = AppDriver(limits)
    trade(d, 5, ts=10)
    limit(d, 6, ts=20)
    trade(d, 5, ts=30)  # 10 > 6: over the limit set at 20
    trade(d, 1, ts=15, key="b")
    outputs = d.run()
    assert [(o.key, o.value) for o in outputs] == [
        ("a", {"position": 5, "limit": None}),
        ("b", {"position": 1, "limit": None}),
    ]
    assert [letter.error_type for letter in d.dead_letters] == ["over_limit"]
    assert d.verify().ok


def test_a_crash_restores_the_table_from_its_topic_to_the_end() -> None:
    d = AppDriver(limits)
    limit(d, 3, ts=1)
    trade(d, 2, ts=2)
    d.run()
    d.crash()
    assert d.tasks[0].state.tables["limits"]["a"] == 3
    d.send("a", {"qty": 2}, topic=TRADES, timestamp_ms=3)
    assert [letter.error_type for letter in d.dead_letters] == ["over_limit"]
    assert d.verify().ok


def aborted_once(d: AppDriver) -> None:
    """A first commit that goes through, then a transaction holding a trade, a limit and a later trade that aborts:
    the records are taken again, the limit with them."""
    d.send("b", {"qty": 1}, topic=TRADES, timestamp_ms=1)
    trade(d, 5, ts=10)
    limit(d, 6, ts=20)
    trade(d, 5, ts=30)
    d.run()


def test_an_abort_undoes_the_tables_updates_with_the_rest() -> None:
    d = AppDriver(limits, test_abort_every=2)
    aborted_once(d)
    assert [o.value for o in d.outputs if o.key == "a"] == [{"position": 5, "limit": None}]
    assert d.verify().ok


def test_the_checker_finds_table_updates_left_after_an_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red on purpose: a rewind that keeps the aborted transaction's table updates: the trade taken again sees a limit
    from its future."""
    monkeypatch.setattr(inputs_module.TableStore, "undo_transaction", lambda self: None)
    d = AppDriver(limits, test_abort_every=2)
    aborted_once(d)
    verdict = d.verify()
    assert not verdict.ok and verdict.content.count + verdict.state.count > 0, verdict.summary()


# -- the order taken, and the checker that replays it ----------------------------------------------------------------
def out_of_timestamp_order(d: AppDriver) -> None:
    """A trade is taken alone; a limit stamped before it arrives later: the task took them out of timestamp order."""
    d.send("a", {"qty": 5}, topic=TRADES, timestamp_ms=50)
    limit(d, 4, ts=10)
    d.send("a", {"qty": 1}, topic=TRADES, timestamp_ms=60)


def test_the_checker_replays_the_order_the_checkpoints_name() -> None:
    d = AppDriver(limits, max_task_idle_ms=-1)
    out_of_timestamp_order(d)
    assert [letter.error_type for letter in d.dead_letters] == ["over_limit"]  # the second trade: 6 > 4
    assert d.verify().ok  # a timestamp merge would have put the limit first and rejected the first trade


def test_the_checker_without_the_order_finds_the_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red on purpose: checkpoints that do not name the order leave the checker the timestamp merge, which is not
    what the task did."""
    original = MultiInputTask.prepare_commit

    def without_order(self: MultiInputTask) -> list[TopicPartition]:
        self._runs.clear()
        return original(self)

    monkeypatch.setattr(MultiInputTask, "prepare_commit", without_order)
    d = AppDriver(limits, max_task_idle_ms=-1)
    out_of_timestamp_order(d)
    assert not d.verify().ok


# -- the bounded wait for an empty input ----------------------------------------------------------------------------
class Watermarks:
    def __init__(self, high: int) -> None:
        self.high = high

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, self.high


def waiting_task(idle_ms: int, high: int) -> MultiInputTask:
    task = MultiInputTask.__new__(MultiInputTask)
    task._idle_s = idle_ms / 1000
    task.partition = 0
    task.next_offsets = {TRADES: 0, LIMITS: 4}
    task._empty_since = {TRADES: 100.0, LIMITS: 100.0}
    task.ctx = types.SimpleNamespace(consumer=Watermarks(high))  # type: ignore[assignment]
    return task


def test_an_empty_input_with_records_on_the_broker_is_waited_for_at_most_max_task_idle_ms() -> None:
    task = waiting_task(idle_ms=100, high=9)  # offsets 4..8 of the limits not fetched yet
    assert task._must_wait(LIMITS, now=100.05)
    assert not task._must_wait(LIMITS, now=100.2)


def test_an_empty_input_that_is_caught_up_is_not_waited_for_and_minus_one_never_waits() -> None:
    assert not waiting_task(idle_ms=100, high=4)._must_wait(LIMITS, now=100.0)
    assert not waiting_task(idle_ms=-1, high=9)._must_wait(LIMITS, now=100.0)


def test_the_checker_names_a_record_moved_past_without_being_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red on purpose: a task that drops a fetched record and goes on past it commits runs that name fewer records
    than its offsets cover. The checker says so, at the checkpoint, instead of replaying other records in their place
    (the replay takes records by count)."""
    enqueue = inputs_module.enqueue

    def dropping_offset_1(queues, positions, messages):  # type: ignore[no-untyped-def]
        enqueue(queues, positions, [m for m in messages if (m.topic(), m.offset()) != (TRADES, 1)])

    monkeypatch.setattr(inputs_module, "enqueue", dropping_offset_1)
    d = AppDriver(limits, partitions=1)
    for ts in (10, 20, 30):
        trade(d, 1, ts=ts)
    d.run()
    verdict = d.verify()
    assert not verdict.ok
    assert any(
        "the order taken names 2 records, the next offset 3 covers 3" in p.detail for p in verdict.content.samples
    ), verdict.summary()


def test_the_wait_for_an_empty_input_starts_when_p_starts_taking_not_when_the_task_was_made() -> None:
    """A take-over that fenced and restored for an hour still waits for the table's records just behind: red when
    `_empty_since` kept the task's creation time (the wait had long expired by the first record)."""
    task = waiting_task(idle_ms=100, high=9)
    task.topics = (TRADES, LIMITS)
    task._empty_since = {TRADES: time.monotonic() - 3600, LIMITS: time.monotonic() - 3600}
    task._phase = Phase.REWINDING
    task.schedule = types.SimpleNamespace(moved=lambda t: None)  # type: ignore[assignment]
    task._transition(Phase.RUNNING)
    assert task._must_wait(LIMITS, now=time.monotonic())
