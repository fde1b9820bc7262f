"""The PostgreSQL sink with several inputs and tables (docs/inputs.md), no servers: the runner no longer refuses
them, its task takes records by the Kafka sink's rule (pipeline/core/merge.py), a co-partitioned table's records
update the table, a held record's dead letter becomes a row naming it, and the commit writes every topic's offset
and the order taken in the batch's transaction."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest

from pipeline import settings as settings_module
from pipeline.app import App, Output, Record, State, Stream, Table, dead_letter
from pipeline.core.lifecycle import Phase
from pipeline.examples import order_fills
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.inputs import PostgresMultiTask
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.sinks.postgres.tables import BytesOutputs, refuse_unfit
from pipeline.sinks.postgres.task import PostgresTaskContext
from tests.fakes import kafka_message

ORDERS, FILLS, LIMITS = "u-orders", "u-fills", "u-limits"


def process(state: State, record: Record) -> Iterable[Output]:
    if record.value == "hold":
        state["held"] = list(record)
        return []
    if record.value == "release":
        return [dead_letter(Record(*state.pop("held")), "late", "released as a dead letter")]
    return [Output(key=record.key, value={"from": record.topic, "limit": state.tables["limits"].get(record.key)})]


app = App(
    name="u",
    inputs=[Stream(ORDERS), Stream(FILLS)],
    tables={"limits": Table(LIMITS)},
    output_topic="",
    process=process,
)


class Cursor:
    rowcount = 1

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def execute(self, statement: Any, params: Any = None) -> Cursor:
        self.statements.append((statement.as_string(None) if hasattr(statement, "as_string") else statement, params))
        return self

    def executemany(self, statement: Any, params: Any) -> None:
        self.statements.append((statement.as_string(None), list(params)))


def running_task(idle_ms: int = -1) -> PostgresMultiTask:
    settings = Settings(sink="postgres", postgres_dsn="postgresql://unused", max_task_idle_ms=idle_ms)
    ctx = PostgresTaskContext(app, settings, "u", ORDERS, None, BytesOutputs(), Metrics(), "me")  # type: ignore[arg-type]
    task = PostgresMultiTask(ctx, 0)
    task.epoch = 3
    task.start(None, restore=False)
    assert task.phase is Phase.RUNNING
    return task


def message(topic: str, offset: int, ts: int, value: bytes | None = b'"x"', key: bytes = b"k") -> Any:
    return kafka_message(offset, key, value, topic=topic, timestamp_ms=ts)


def test_the_postgresql_sink_runs_several_inputs_tables_and_global_tables() -> None:
    """Red before: the runner refused them at start-up ("Kafka-sink only; SINK=postgres cannot run this App")."""
    settings = settings_module.load(env={}, sink="postgres", postgres_dsn="postgresql://unused/db")
    PostgresRunner(app, settings)
    PostgresRunner(order_fills.app, settings)
    refuse_unfit(order_fills.app, settings)


def test_records_are_taken_in_timestamp_order_tables_first_and_update_the_table() -> None:
    task = running_task()
    task.process(
        [
            message(ORDERS, 0, ts=30),
            message(FILLS, 0, ts=10),
            message(FILLS, 1, ts=40),
            message(LIMITS, 0, ts=30, value=b"7"),  # the same time as the order: the table goes first
        ]
    )
    assert [(row.index, row.offset, row.output.value) for row in task.rows] == [
        (1, 0, {"from": FILLS, "limit": None}),
        (0, 0, {"from": ORDERS, "limit": 7}),
        (1, 1, {"from": FILLS, "limit": 7}),
    ]
    assert task._runs.encode() == "1:1,2:1,0:1,1:1"
    assert task.next_offsets == {ORDERS: 1, FILLS: 2, LIMITS: 1} and task.next_offset == 1


def test_a_held_record_released_as_a_dead_letter_is_a_row_naming_it() -> None:
    task = running_task()
    task.process([message(FILLS, 0, ts=1, value=b'"hold"'), message(ORDERS, 0, ts=2, value=b'"release"')])
    [letter] = task.dead_letters
    assert (letter.topic, letter.partition, letter.offset, letter.error_type, letter.rejected) == (
        FILLS,
        0,
        0,
        "late",
        True,
    )
    assert task.rows == []


def test_the_commit_moves_every_topic_s_row_and_records_the_order_and_where_each_topic_began() -> None:
    task = running_task()
    task.process([message(FILLS, 0, ts=10), message(ORDERS, 0, ts=20), message(LIMITS, 0, ts=30, value=b"1")])
    cur = Cursor()
    task.advance_offset(cur)  # type: ignore[arg-type]
    (first, first_params), (others, other_params), (order, order_params) = cur.statements
    assert first.startswith("UPDATE") and "epoch = " in first and first_params == (1, "u", ORDERS, 0, 3)
    assert others.startswith("INSERT") and [row[1:4] for row in other_params] == [(FILLS, 0, 1), (LIMITS, 0, 1)]
    assert "pipeline_merge_order" in order and order_params[:4] == ("u", ORDERS, 0, 3)
    assert order_params[4].obj == {ORDERS: None, FILLS: None, LIMITS: None} and order_params[5] == "1:1,0:1,2:1"
    task.batch_committed()
    task.process([message(ORDERS, 1, ts=40)])
    cur = Cursor()
    task.advance_offset(cur)  # type: ignore[arg-type]
    assert cur.statements[-1][1][4].obj == {ORDERS: 1, FILLS: 1, LIMITS: 1}  # the next transaction began there
    assert cur.statements[-1][1][5] == "0:1"


def test_an_empty_input_with_records_on_the_broker_holds_the_others_back_for_max_task_idle_ms() -> None:
    class Watermarks:
        def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
            return 0, 5  # every topic has records not fetched yet

    task = running_task(idle_ms=60_000)
    task.consumer = Watermarks()  # type: ignore[assignment]
    task._empty_since = dict.fromkeys(task._empty_since, float("inf"))  # ran dry just now, as far as it knows
    task.process([message(ORDERS, 0, ts=1)])
    assert task.rows == []  # fills and limits may still bring something earlier
    task._idle_s = -1
    task.tick()
    assert [row.offset for row in task.rows] == [0]


@pytest.mark.parametrize("timers", [{"on_timer": lambda s, t: []}, {"state_ttl_ms": 1000}])
def test_timers_and_ttl_stay_kafka_mode_only(timers: dict[str, Any]) -> None:
    timed = App("t", "in", "", process=lambda s, r: [], **timers)
    settings = settings_module.load(env={}, sink="postgres", postgres_dsn="postgresql://unused/db")
    with pytest.raises(settings_module.ConfigError, match="Kafka-mode only"):
        refuse_unfit(timed, settings)


def test_the_wait_for_an_empty_input_starts_when_p_starts_taking_not_when_the_task_was_made() -> None:
    """As the Kafka sink's: a fence or a restore that took long does not count as time the lagging table was waited
    for. Red when `_empty_since` kept the task's creation time."""

    class Watermarks:
        def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
            return 0, 5

    settings = Settings(sink="postgres", postgres_dsn="postgresql://unused", max_task_idle_ms=60_000)
    ctx = PostgresTaskContext(app, settings, "u", ORDERS, None, BytesOutputs(), Metrics(), "me")  # type: ignore[arg-type]
    task = PostgresMultiTask(ctx, 0)
    task.epoch = 3
    task._empty_since = dict.fromkeys(task._empty_since, time.monotonic() - 3600)  # made an hour before it ran
    task.start(None, restore=False)
    task.consumer = Watermarks()  # type: ignore[assignment]
    task.process([message(ORDERS, 0, ts=1)])
    assert task.rows == []
