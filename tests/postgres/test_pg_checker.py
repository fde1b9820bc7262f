"""The table checker on plain data: it passes a correct run and names a duplicate, a loss, a wrong total, an offset
that is not at the input's end, each in its own category."""

from __future__ import annotations

from dataclasses import replace

import orjson

from pipeline.app import Output
from pipeline.core.deadletter import DeadLetter
from pipeline.examples.running_totals_pg import app
from pipeline.sinks.postgres.tables import StoredOutput
from pipeline.testing.oracle import KafkaRecord, TopicDump
from pipeline.testing.postgres_checker import TableRun, check_tables

TOPIC = "in"


def correct_run() -> TableRun:
    inputs = [KafkaRecord(0, i, b"acct-%d" % (i % 2), orjson.dumps({"id": i, "amount": 10})) for i in range(6)]
    inputs.append(KafkaRecord(0, 6, b"acct-0", b"not json"))
    totals: dict[str, list[int]] = {}
    outputs = []
    for record in inputs[:6]:
        count, total = totals.get(record.key.decode(), (0, 0))
        totals[record.key.decode()] = [count + 1, total + 10]
        value = {"id": record.offset, "count": count + 1, "sum": total + 10}
        outputs.append(StoredOutput(record.offset + 1, 0, record.offset, Output(key=record.key.decode(), value=value)))
    letter = DeadLetter(TOPIC, 0, 6, b"acct-0", b"not json", "SerdeError", "invalid JSON", 3)
    states = {0: {k: orjson.dumps(v) for k, v in totals.items()}}
    return TableRun(TOPIC, TopicDump(TOPIC, inputs, {0: 7}), outputs, [(1, letter)], states, {0: (7, 3)}, [])


def test_a_correct_run_passes():
    verdict = check_tables(app, correct_run())
    assert verdict.ok, verdict.summary()
    assert (verdict.inputs, verdict.outputs, verdict.dead_letters) == (7, 6, 1)


def test_a_duplicate_row_is_reported_as_a_duplicate():
    run = correct_run()
    again = replace(run.outputs[2], order=99)
    verdict = check_tables(app, replace(run, outputs=[*run.outputs, again]))
    assert verdict.duplicates.count == 1 and verdict.losses.count == 0
    assert str(verdict.duplicates.samples[0]).startswith("0:2:")


def test_a_missing_row_a_wrong_state_a_derived_problem_and_a_short_offset_are_reported():
    run = correct_run()
    wrong_state = {0: {**run.states[0], "acct-1": orjson.dumps([3, 99])}}
    verdict = check_tables(
        app,
        replace(
            run,
            outputs=run.outputs[:-1],
            states=wrong_state,
            offsets={0: (5, 3)},
            derived_problems=["totals 'acct-1': (3, 99) != reference (3, 30)"],
        ),
    )
    assert verdict.losses.count == 1
    assert verdict.state.count == 2
    assert verdict.offsets.count == 1
    assert verdict.duplicates.count == 0
