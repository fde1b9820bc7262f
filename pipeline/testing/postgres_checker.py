"""The exactly-once checker for the PostgreSQL sink: the tables a run left behind against its input.

The input topic is drained with read_committed (drain.drain_topic), the reference is the same offline fold of
`app.process` (oracle.fold_reference), and the tables are turned into the oracle's plain records so that the same
checks apply:
- every input coordinate has exactly the reference's outputs in the sink's rows (read back by the sink), or one
  dead-letter row; nothing for coordinates that are no input; contents equal the reference's;
- per input partition, rows were written in input-offset order (the sink's row order, e.g. an identity column);
- pipeline_state per partition equals the reference's final state, and the sink's derived tables agree with it
  (running totals: `totals` = the offline fold);
- pipeline_offsets.next_offset of p is 1 + p's last input offset (the group offsets are not checked: monitoring only).

    pipeline verify pipeline.examples.running_totals_pg:app --sink postgres --dsn ... --schema ...
    (or with PIPELINE_SINK=postgres and PIPELINE_POSTGRES_DSN set, as for `pipeline run`)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from pipeline.app import App
from pipeline.core.deadletter import DeadLetter
from pipeline.core.provenance import SOURCE_HEADER, encode_source
from pipeline.kafka.offsets import high_watermarks
from pipeline.loading import load_app
from pipeline.settings import Settings
from pipeline.sinks.postgres.schema import DEAD_LETTERS, OFFSETS, STATE
from pipeline.sinks.postgres.tables import StoredOutput, Target, sink_of
from pipeline.testing.drain import drain_topic
from pipeline.testing.oracle import (
    KafkaRecord,
    TopicDump,
    Verdict,
    check_content,
    check_duplicates,
    check_losses,
    check_next_offset,
    check_order,
    compare_states,
    extra_outputs,
    fold_reference,
    outputs_by_source,
    parse_dead_letters,
)


@dataclass(frozen=True)
class TableRun:
    """What a run left in PostgreSQL, as plain data."""

    input_topic: str
    inputs: TopicDump
    outputs: list[StoredOutput]
    dead_letters: list[tuple[int, DeadLetter]]  # (row id, letter)
    states: dict[int, dict[str, bytes]]
    offsets: dict[int, tuple[int | None, int]]  # p -> (next_offset, epoch)
    derived_problems: list[str]


# The outputs, the dead letters (with their row ids), the state per input partition, p -> (next_offset, epoch).
TableContents = tuple[
    list[StoredOutput], list[tuple[int, DeadLetter]], dict[int, dict[str, bytes]], dict[int, tuple[int | None, int]]
]


def read_tables(conn: psycopg.Connection, target: Target) -> TableContents:
    where = (target.app_id, target.input_topic)
    outputs = sink_of(target.app).read_back(conn, target)
    dead = [
        (row_id, DeadLetter(target.input_topic, p, offset, _bytes(key), _bytes(value), error_type, message, attempts))
        for row_id, p, offset, key, value, error_type, message, attempts in conn.execute(
            sql.SQL(
                "SELECT id, input_partition, input_offset, key, value, error_type, error_message, attempts "
                "FROM {} WHERE app_id = %s AND topic = %s"
            ).format(target.table(DEAD_LETTERS.name)),
            where,
        )
    ]
    states: dict[int, dict[str, bytes]] = {}
    for p, key, value in conn.execute(
        sql.SQL("SELECT input_partition, key, value FROM {} WHERE app_id = %s AND topic = %s").format(
            target.table(STATE.name)
        ),
        where,
    ):
        states.setdefault(p, {})[key] = bytes(value)
    return outputs, dead, states, table_offsets(conn, target)


def table_offsets(conn: psycopg.Connection, target: Target) -> dict[int, tuple[int | None, int]]:
    query = sql.SQL("SELECT input_partition, next_offset, epoch FROM {} WHERE app_id = %s AND topic = %s")
    rows = conn.execute(query.format(target.table(OFFSETS.name)), (target.app_id, target.input_topic))
    return {p: (next_offset, epoch) for p, next_offset, epoch in rows}


def _bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)


def check_tables(app: App, run: TableRun) -> Verdict:
    """All checks over the tables of a run. Pure: no Kafka, no database."""
    out_records = [
        KafkaRecord(
            partition=stored.output.partition or 0,
            offset=stored.order,
            key=app.output_key_serde.serialize(stored.output.key),
            value=app.output_value_serde.serialize(stored.output.value),
            headers=((SOURCE_HEADER, encode_source(stored.partition, stored.offset)),),
        )
        for stored in run.outputs
    ]
    dlq_records = [
        KafkaRecord(
            partition=letter.partition,
            offset=row_id,
            key=letter.key,
            value=letter.value,
            headers=tuple(letter.headers()),
        )
        for row_id, letter in run.dead_letters
    ]
    verdict = Verdict(
        inputs=len(run.inputs.records),
        outputs=len(out_records),
        dead_letters=len(dlq_records),
        changelog_records=sum(len(s) for s in run.states.values()),
        final_outputs=out_records,
    )
    inputs = {record.coord: record for record in run.inputs.records}
    dead = parse_dead_letters(dlq_records, run.input_topic, verdict.content)
    reference = fold_reference(
        app, run.inputs.records, input_topic=run.input_topic, output_topic=app.output_topic, skip=dead.keys()
    )
    by_source = outputs_by_source(out_records)
    verdict.duplicates = check_duplicates(by_source, dead, reference)
    verdict.losses = check_losses(inputs.keys(), by_source, dead, reference)
    verdict.order = check_order(out_records, extra_outputs(by_source, reference))
    check_content(inputs, out_records, by_source, dead, reference, verdict.content)
    for p in sorted(set(run.inputs.partitions) | run.states.keys()):
        compare_states(p, run.states.get(p, {}), reference.states.get(p, {}), verdict.state)
    for problem in run.derived_problems:
        where, _, detail = problem.partition(": ")
        verdict.state.add(where, detail)
    last_data: dict[int, int] = {}
    for record in run.inputs.records:
        last_data[record.partition] = max(record.offset, last_data.get(record.partition, -1))
    for p in run.inputs.partitions:
        lowest = last_data[p] + 1 if p in last_data else None
        next_offset = run.offsets.get(p, (None, 0))[0]
        check_next_offset(verdict.offsets, f"offsets table p{p}", next_offset, lowest, run.inputs.ends[p])
    verdict.notes = [
        "outputs, dead letters, state and offsets read from PostgreSQL ('changelog records' counts the "
        "rows of pipeline_state); group offsets not checked (monitoring only)"
    ]
    return verdict


def decoded_states(app: App, states: dict[int, dict[str, bytes]]) -> dict[int, dict[str, Any]]:
    return {p: {k: app.state_serde.deserialize(v) for k, v in s.items()} for p, s in states.items()}


def verify_tables(
    app: App,
    bootstrap: str,
    dsn: str,
    *,
    schema: str,
    input_topic: str | None = None,
    app_id: str | None = None,
    timeout_s: float = 60.0,
    extra_config: Mapping[str, Any] | None = None,
) -> Verdict:
    """Drains the input topic, reads the tables, checks. Run it after the pipeline stopped (or caught up).
    `extra_config` (security etc.) goes to the Kafka clients."""
    target = Target(schema, app, app_id or app.name, input_topic or app.input_topic)
    config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
    inputs = drain_topic(AdminClient(config), config, target.input_topic, timeout_s)
    if not inputs.exists:
        raise LookupError(f"input topic {target.input_topic} does not exist")
    with psycopg.connect(dsn, connect_timeout=int(timeout_s)) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # one snapshot of every table
        outputs, dead, states, offsets = read_tables(conn, target)
        reference_states = fold_reference(
            app,
            inputs.records,
            input_topic=target.input_topic,
            output_topic=app.output_topic,
            skip={(d.partition, d.offset) for _, d in dead},
        ).states
        derived = sink_of(app).check(conn, target, decoded_states(app, reference_states))
    run = TableRun(target.input_topic, inputs, outputs, dead, states, offsets, derived)
    return check_tables(app, run)


def wait_caught_up(
    bootstrap: str,
    dsn: str,
    target: Target,
    partitions: Sequence[int],
    timeout_s: float,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Waits until the offsets table reaches the input's high watermarks; returns the lag left ({} when caught up)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(extra_config or {})})
    ends = high_watermarks(admin, target.input_topic, list(partitions), 10)
    deadline = time.monotonic() + timeout_s
    lag: dict[int, int] = dict(ends)
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
                offsets = table_offsets(conn, target)
            lag = {p: end - (offsets.get(p, (None, 0))[0] or 0) for p, end in ends.items()}
            lag = {p: n for p, n in lag.items() if n > 0}
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            pass  # the server is being restarted by a test, or the tables are not created yet: look again
        if not lag or time.monotonic() > deadline:
            return lag
        time.sleep(0.25)


@dataclass(frozen=True)
class Tables:
    """Where a PostgreSQL-sink run writes: the database and the schema."""

    dsn: str
    schema: str

    def env(self) -> dict[str, str]:
        """What `pipeline run` processes need to write here."""
        return {"PIPELINE_SINK": "postgres", "PIPELINE_POSTGRES_DSN": self.dsn, "PIPELINE_POSTGRES_SCHEMA": self.schema}

    def drop(self) -> None:
        with psycopg.connect(self.dsn, connect_timeout=10, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))


def chosen_tables(
    sink: str | None, dsn: str | None, schema: str | None, config_file: str | None = None
) -> Tables | None:
    """The sink a run writes to, decided as `pipeline run` decides it: the option, else PIPELINE_SINK (environment or
    config file), else kafka. None for the Kafka sink; for PostgreSQL the DSN and schema, from the options or the
    same settings. Raises ConfigError (e.g. SINK=postgres without a DSN)."""
    settings = Settings.load(config_file, sink=sink, postgres_dsn=dsn, postgres_schema=schema)
    return Tables(settings.postgres_dsn, settings.postgres_schema) if settings.sink == "postgres" else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.testing.postgres_checker",
        description="Check the tables of a PostgreSQL-sink run for exactly-once.",
    )
    parser.add_argument("app")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", default="public")
    parser.add_argument("--input-topic")
    parser.add_argument("--app-id")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    verdict = verify_tables(
        load_app(args.app),
        args.bootstrap_servers,
        args.dsn,
        schema=args.schema,
        input_topic=args.input_topic,
        app_id=args.app_id,
    )
    print(verdict.to_json() if args.json else verdict.summary())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
