"""The PostgreSQL checker with several inputs and tables (pipeline/testing/postgres_checker.py), on plain data: it
replays the order pipeline_merge_order recorded, where each transaction began included (a co-partitioned table read
ahead by a take-over's restore), and finds a run whose recorded order or offsets do not hold."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from pipeline.app import App, Output, Record, Reject, State, Stream, Table
from pipeline.core.deadletter import DeadLetter
from pipeline.sinks.postgres.tables import StoredOutput
from pipeline.testing.oracle import KafkaRecord, TopicDump
from pipeline.testing.postgres_checker import TableRun, check_tables

TRADES, LIMITS = "pgc-trades", "pgc-limits"


def process(state: State, record: Record) -> Iterable[Output]:
    limit = state.tables["limits"].get(record.key)
    position = state.get(record.key, 0) + record.value["qty"]
    if limit is not None and position > limit:
        raise Reject("over_limit", f"{record.key}: {position} > {limit}")
    state[record.key] = position
    return [Output(key=record.key, value={"position": position, "limit": limit}, partition=record.partition)]


app = App(name="pgc", inputs=[Stream(TRADES)], output_topic="", process=process, tables={"limits": Table(LIMITS)})


def dump(topic: str, *records: tuple[int, object, int]) -> TopicDump:
    """(offset, value, timestamp) records of partition 0, key "a"."""
    found = [KafkaRecord(0, offset, b"a", orjson.dumps(value), (), ts) for offset, value, ts in records]
    return TopicDump(topic, found, {0: len(records)})


def output(row: int, offset: int, position: int, limit: int | None) -> StoredOutput:
    return StoredOutput(row, 0, offset, Output(key="a", value={"position": position, "limit": limit}, partition=0))


def rejected(offset: int) -> tuple[int, DeadLetter]:
    value = orjson.dumps({"qty": 1})
    return 1, DeadLetter(TRADES, 0, offset, b"a", value, "over_limit", "a: 6 > 4", 1, rejected=True)


def out_of_timestamp_order(transactions: dict) -> TableRun:
    """A trade stamped 50 taken alone, then a limit stamped 10 that arrived later, then a trade stamped 60 (over the
    limit): what a task does when the limit's topic lagged past MAX_TASK_IDLE_MS."""
    return TableRun(
        TRADES,
        dump(TRADES, (0, {"qty": 5}, 50), (1, {"qty": 1}, 60)),
        [output(1, 0, 5, None)],
        [rejected(1)],
        {0: {"a": b"5"}},
        {0: (2, 1)},
        [],
        more_inputs={LIMITS: dump(LIMITS, (0, 4, 10))},
        more_offsets={LIMITS: {0: 1}},
        transactions=transactions,
    )


def test_the_recorded_order_is_replayed() -> None:
    transactions = {0: [({TRADES: None, LIMITS: None}, [(0, 1)]), ({TRADES: 1, LIMITS: None}, [(1, 1), (0, 1)])]}
    verdict = check_tables(app, out_of_timestamp_order(transactions))
    assert verdict.ok, verdict.summary()


def test_without_the_recorded_order_the_checker_finds_the_difference() -> None:
    """Red on purpose: the timestamp merge puts the limit first, which is not what the task did."""
    verdict = check_tables(app, out_of_timestamp_order({}))
    assert not verdict.ok


def test_a_table_read_ahead_by_a_restore_is_loaded_where_the_transaction_began() -> None:
    """The take-over's restore read the limit (stamped after the trade) before the first transaction: the trade saw
    it. Counting runs from the table's start instead (its record would come last) is red."""
    run = TableRun(
        TRADES,
        dump(TRADES, (0, {"qty": 5}, 50)),
        [],
        [(1, DeadLetter(TRADES, 0, 0, b"a", orjson.dumps({"qty": 5}), "over_limit", "a: 5 > 4", 1, rejected=True))],
        {},
        {0: (1, 1)},
        [],
        more_inputs={LIMITS: dump(LIMITS, (0, 4, 100))},
        more_offsets={LIMITS: {0: 1}},
        transactions={0: [({TRADES: None, LIMITS: 1}, [(0, 1)])]},
    )
    assert check_tables(app, run).ok, check_tables(app, run).summary()
    without_start = {0: [({TRADES: None, LIMITS: None}, [(0, 1)])]}
    assert not check_tables(app, TableRun(**{**run.__dict__, "transactions": without_start})).ok


def test_a_transaction_that_begins_past_or_before_what_was_taken_is_found() -> None:
    skipped = {0: [({TRADES: None, LIMITS: None}, [(0, 1)]), ({TRADES: 2, LIMITS: None}, [(1, 1)])]}
    again = {0: [({TRADES: None, LIMITS: None}, [(0, 1)]), ({TRADES: 0, LIMITS: None}, [(1, 1), (0, 1)])]}
    for transactions, finding in ((skipped, "skipped"), (again, "before records taken already")):
        verdict = check_tables(app, out_of_timestamp_order(transactions))
        assert any(finding in problem.detail for problem in verdict.content.samples), verdict.summary()


def desk_of(state: State, record: Record) -> Iterable[Output]:
    return [Output(key=record.key, value={"desk": state.tables["desks"].get(record.key)})]


def test_a_one_input_app_reading_a_global_table_is_folded_with_the_table() -> None:
    """Red before: the one-input fold gave `process` no tables (KeyError: every record a failure)."""
    desks = App(name="pgd", input_topic="pgd-in", output_topic="", process=desk_of, global_tables={"desks": "pgd-g"})
    run = TableRun(
        "pgd-in",
        TopicDump("pgd-in", [KafkaRecord(0, 0, b"a", b"{}", (), 20)], {0: 1}),
        [StoredOutput(1, 0, 0, Output(key="a", value={"desk": "d1"}))],
        [],
        {},
        {0: (1, 1)},
        [],
        global_tables={"desks": TopicDump("pgd-g", [KafkaRecord(0, 0, b"a", b'"d1"', (), 10)], {0: 1})},
    )
    verdict = check_tables(desks, run)
    assert verdict.ok, verdict.summary()
