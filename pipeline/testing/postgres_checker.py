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
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from pipeline.sinks.postgres.schema import DEAD_LETTERS, MERGE_ORDER, OFFSETS, STATE
from pipeline.sinks.postgres.tables import StoredOutput, Target, sink_of
from pipeline.state.changelog import order_runs
from pipeline.testing.drain import drain_topic
from pipeline.testing.oracle import (
    Coord,
    DeadLetterEntry,
    Findings,
    KafkaRecord,
    Reference,
    RunData,
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
from pipeline.testing.oracle.inputs import (
    GLOBAL_TABLE_NOTE,
    Transaction,
    all_inputs,
    by_declared_names,
    fold_several,
    order_of_transactions,
    topics_of,
)


@dataclass(frozen=True)
class TableRun:
    """What a run left in PostgreSQL, as plain data. Several inputs or tables (docs/inputs.md): the other
    co-partitioned topics (inputs, then tables, in the App's order), the global tables by name, every topic's offsets
    rows, and each partition's transactions as pipeline_merge_order recorded them (the order to replay)."""

    input_topic: str
    inputs: TopicDump
    outputs: list[StoredOutput]
    dead_letters: list[tuple[int, DeadLetter]]  # (row id, letter)
    states: dict[int, dict[str, bytes]]
    offsets: dict[int, tuple[int | None, int]]  # p -> (next_offset, epoch)
    derived_problems: list[str]
    more_inputs: dict[str, TopicDump] = field(default_factory=dict)
    global_tables: dict[str, TopicDump] = field(default_factory=dict)
    more_offsets: dict[str, dict[int, int | None]] = field(default_factory=dict)  # topic -> p -> next offset
    transactions: dict[int, list[Transaction]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableContents:
    """The rows of one run, read in one snapshot."""

    outputs: list[StoredOutput]
    dead_letters: list[tuple[int, DeadLetter]]  # (row id, letter)
    states: dict[int, dict[str, bytes]]
    offsets: dict[str, dict[int, tuple[int | None, int]]]  # topic -> p -> (next_offset, epoch)
    transactions: dict[int, list[Transaction]]


def read_tables(conn: psycopg.Connection, target: Target) -> TableContents:
    topics = list(target.topics)
    outputs = sink_of(target.app).read_back(conn, target)
    dead = [
        (row_id, DeadLetter(topic, p, offset, _bytes(key), _bytes(value), error_type, message, attempts, rejected))
        for row_id, topic, p, offset, key, value, error_type, message, attempts, rejected in conn.execute(
            sql.SQL(
                "SELECT id, topic, input_partition, input_offset, key, value, error_type, error_message, attempts, "
                "rejected FROM {} WHERE app_id = %s AND topic = ANY(%s)"
            ).format(target.table(DEAD_LETTERS.name)),
            (target.app_id, topics),
        )
    ]
    states: dict[int, dict[str, bytes]] = {}
    for p, key, value in conn.execute(
        sql.SQL("SELECT input_partition, key, value FROM {} WHERE app_id = %s AND topic = %s").format(
            target.table(STATE.name)
        ),
        (target.app_id, target.input_topic),
    ):
        states.setdefault(p, {})[key] = bytes(value)
    transactions: dict[int, list[Transaction]] = {}
    for p, start, runs in conn.execute(
        sql.SQL(
            "SELECT input_partition, start_offsets, runs FROM {} WHERE app_id = %s AND topic = %s ORDER BY id"
        ).format(target.table(MERGE_ORDER.name)),
        (target.app_id, target.input_topic),
    ):
        transactions.setdefault(p, []).append((start, order_runs(runs)))
    return TableContents(outputs, dead, states, topic_offsets(conn, target), transactions)


def table_offsets(conn: psycopg.Connection, target: Target) -> dict[int, tuple[int | None, int]]:
    return topic_offsets(conn, target).get(target.input_topic, {})


def topic_offsets(conn: psycopg.Connection, target: Target) -> dict[str, dict[int, tuple[int | None, int]]]:
    """topic -> p -> (next_offset, epoch), for every co-partitioned topic of the run."""
    query = sql.SQL(
        "SELECT topic, input_partition, next_offset, epoch FROM {} WHERE app_id = %s AND topic = ANY(%s)"
    ).format(target.table(OFFSETS.name))
    found: dict[str, dict[int, tuple[int | None, int]]] = {}
    for topic, p, next_offset, epoch in conn.execute(query, (target.app_id, list(target.topics))):
        found.setdefault(topic, {})[p] = (next_offset, epoch)
    return found


def _bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)


def as_records(app: App, run: TableRun) -> tuple[list[KafkaRecord], list[KafkaRecord]]:
    """The output rows and dead-letter rows as the oracle's records: an output's source is its input coordinate
    (with its input's index), its position the order rows were written in."""
    outputs = [
        KafkaRecord(
            partition=stored.output.partition or 0,
            offset=stored.order,
            key=app.output_key_serde.serialize(stored.output.key),
            value=app.output_value_serde.serialize(stored.output.value),
            headers=((SOURCE_HEADER, encode_source(stored.partition, stored.offset, stored.index)),),
        )
        for stored in run.outputs
    ]
    letters = [
        KafkaRecord(letter.partition, row_id, letter.key, letter.value, tuple(letter.headers()))
        for row_id, letter in run.dead_letters
    ]
    return outputs, letters


def as_run_data(app: App, run: TableRun, outputs: list[KafkaRecord], letters: list[KafkaRecord]) -> RunData:
    """The run as the Kafka checker's plain data: what the oracle's fold and the App's own check read."""
    return RunData(
        run.input_topic,
        run.inputs,
        TopicDump(app.output_topic, outputs, {}),
        TopicDump(DEAD_LETTERS.name, letters, {}),
        None,
        {},
        more_inputs=run.more_inputs,
        global_tables=run.global_tables,
    )


def not_folded(dead: Mapping[Coord, list[DeadLetterEntry]]) -> set[Coord]:
    """The dead-lettered records the fold leaves out: not the ones rejected on purpose (the reference must reject
    them too)."""
    return {coord for coord, entries in dead.items() if not all(e.letter.rejected for e in entries)}


def table_reference(app: App, run: TableRun, data: RunData, skip: Collection[Coord], found: Findings) -> Reference:
    """The offline fold: for several inputs in the order the merge-order rows name; an App reading global tables with
    them as of each record's timestamp (pipeline/testing/oracle/inputs.py), one input or several."""
    if not (app.multi_input or app.global_tables):
        return fold_reference(
            app, run.inputs.records, input_topic=run.input_topic, output_topic=app.output_topic, skip=skip
        )
    return fold_several(app, data, skip, found, order=order_of_transactions(app, data, run.transactions, found))


def check_tables(app: App, run: TableRun) -> Verdict:
    """All checks over the tables of a run. Pure: no Kafka, no database."""
    out_records, dlq_records = as_records(app, run)
    data = as_run_data(app, run, out_records, dlq_records)
    verdict = Verdict(
        inputs=len(run.inputs.records) + sum(len(dump.records) for dump in run.more_inputs.values()),
        outputs=len(out_records),
        dead_letters=len(dlq_records),
        changelog_records=sum(len(s) for s in run.states.values()),
        final_outputs=out_records,
    )
    inputs = all_inputs(data)  # one input: (partition, offset) coordinates, as before
    dead = parse_dead_letters(dlq_records, topics_of(data), verdict.content)
    reference = table_reference(app, run, data, not_folded(dead), verdict.content)
    by_source = outputs_by_source(out_records)
    verdict.duplicates = check_duplicates(by_source, dead, reference)
    verdict.losses = check_losses(inputs.keys(), by_source, dead, reference)
    verdict.order = check_order(out_records, extra_outputs(by_source, reference))
    values = not app.global_tables  # values read from a global table are the App's own check's business
    check_content(inputs, out_records, by_source, dead, reference, verdict.content, values)
    for p in sorted(set(run.inputs.partitions) | run.states.keys()):
        compare_states(p, run.states.get(p, {}), reference.states.get(p, {}), verdict.state)
    for problem in run.derived_problems:
        where, _, detail = problem.partition(": ")
        verdict.state.add(where, detail)
    verdict.offsets = _check_offsets(run)
    for problem in app.check(by_declared_names(app, data)) if app.check is not None else ():
        where, _, detail = problem.partition(": ")
        verdict.app.add(where, detail or where)
    verdict.notes = [
        "outputs, dead letters, state and offsets read from PostgreSQL ('changelog records' counts the "
        "rows of pipeline_state); group offsets not checked (monitoring only)"
    ] + ([] if values else [GLOBAL_TABLE_NOTE])
    return verdict


def _check_offsets(run: TableRun) -> Findings:
    """Every co-partitioned topic's offsets row of p points past its last record (a table's may be further, up to
    the end: a restore reads it to the end)."""
    found = Findings()
    offsets = {run.input_topic: {p: row[0] for p, row in run.offsets.items()}, **run.more_offsets}
    for dump in [run.inputs, *run.more_inputs.values()]:
        last_data: dict[int, int] = {}
        for record in dump.records:
            last_data[record.partition] = max(record.offset, last_data.get(record.partition, -1))
        for p in dump.partitions:
            lowest = last_data[p] + 1 if p in last_data else None
            where = f"offsets table p{p}" if dump is run.inputs else f"offsets table {dump.topic}[{p}]"
            check_next_offset(found, where, offsets.get(dump.topic, {}).get(p), lowest, dump.ends[p])
    return found


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
    """Drains the input topics (several inputs: every co-partitioned topic and global table), reads the tables,
    checks. Run it after the pipeline stopped (or caught up). `extra_config` (security etc.) goes to the Kafka
    clients."""
    target = Target(schema, app, app_id or app.name, input_topic or app.input_topic)
    config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
    admin = AdminClient(config)
    dumps = {topic: drain_topic(admin, config, topic, timeout_s) for topic in target.topics}
    if not dumps[target.input_topic].exists:
        raise LookupError(f"input topic {target.input_topic} does not exist")
    global_tables = {
        name: drain_topic(admin, config, spec.topic, timeout_s) for name, spec in app.global_table_specs.items()
    }
    with psycopg.connect(dsn, connect_timeout=int(timeout_s)) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # one snapshot of every table
        rows = read_tables(conn, target)
        offsets = rows.offsets
        run = TableRun(
            target.input_topic,
            dumps[target.input_topic],
            rows.outputs,
            rows.dead_letters,
            rows.states,
            offsets.get(target.input_topic, {}),
            [],
            {topic: dumps[topic] for topic in target.topics[1:]},
            global_tables,
            {topic: {p: row[0] for p, row in offsets.get(topic, {}).items()} for topic in target.topics[1:]},
            rows.transactions,
        )
        out_records, dlq_records = as_records(app, run)
        data = as_run_data(app, run, out_records, dlq_records)
        skip = not_folded(parse_dead_letters(dlq_records, topics_of(data), Findings()))
        states = table_reference(app, run, data, skip, Findings()).states
        derived = sink_of(app).check(conn, target, decoded_states(app, states))
    return check_tables(app, replace(run, derived_problems=derived))


def wait_caught_up(
    bootstrap: str,
    dsn: str,
    target: Target,
    partitions: Sequence[int],
    timeout_s: float,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Waits until the offsets table reaches the high watermarks of every topic task p reads (several inputs: each
    of them and the co-partitioned tables); returns the lag left per partition ({} when caught up)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(extra_config or {})})
    ends = {topic: high_watermarks(admin, topic, list(partitions), 10) for topic in target.topics}
    deadline = time.monotonic() + timeout_s
    lag: dict[int, int] = {p: sum(by_p[p] for by_p in ends.values()) for p in partitions}
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
                offsets = topic_offsets(conn, target)
            lag = defaultdict(int)
            for topic, by_p in ends.items():
                for p, end in by_p.items():
                    lag[p] += max(0, end - (offsets.get(topic, {}).get(p, (None, 0))[0] or 0))
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
