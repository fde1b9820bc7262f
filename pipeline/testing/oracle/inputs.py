"""The oracle for an App with several inputs or tables (docs/inputs.md).

Task p took the records of its topics in an order that depended on when they arrived. Each committed checkpoint names
that order for its transaction (runs "index:count", pipeline/state/changelog.py), so the reference replays exactly
the interleaving the run committed: the same records reach `process` in the same order, a co-partitioned table's
records update the reference's table where the run's did. A stateless App writes no checkpoints: its records are
merged by timestamp (ties: tables first, then the App's order), which is the order a task takes them in when every
input has records waiting; outputs of a stateless App do not depend on the order anyway.

A global table is read by the run as it was when each output was produced, which no offline fold can know: the
reference reads it as of each record's timestamp, and outputs are compared by key and partition only (their values
are the App's own check's business, App.check). Everything else is checked as for one input, with coordinates
(partition, offset) for the first input and (partition, offset, index) for the others.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import cast

from pipeline.app import DEAD_LETTERS, HELD_HEADER, App, Reject
from pipeline.core.provenance import TimerSource
from pipeline.serde import JSON
from pipeline.state.changelog import Checkpoint, is_checkpoint, order_runs
from pipeline.state.store import PartitionState
from pipeline.state.tables import TableStore, TableView
from pipeline.state.timed import TimedState
from pipeline.testing.oracle.records import Coord, ExpectedOutput, KafkaRecord, RunData
from pipeline.testing.oracle.reference import Reference, encode_output
from pipeline.testing.oracle.timers import Firings, new_state
from pipeline.testing.oracle.verdict import Findings

GLOBAL_TABLE_NOTE = "the App reads global tables: output values compared by its own check (App.check), not here"


def topics_of(run: RunData) -> list[str]:
    """The co-partitioned topics in the App's order: the first input, then the others."""
    return [run.input_topic, *run.more_inputs]


def coord(record: KafkaRecord, index: int) -> Coord:
    return (record.partition, record.offset) if index == 0 else (record.partition, record.offset, index)


def all_inputs(run: RunData) -> dict[Coord, KafkaRecord]:
    """Every record of every co-partitioned topic, by coordinate."""
    dumps = [run.inputs, *run.more_inputs.values()]
    return {coord(record, i): record for i, dump in enumerate(dumps) for record in dump.records}


def processing_order(
    app: App, run: RunData, found: Findings, taken_in: dict[Coord, str] | None = None
) -> dict[int, list[tuple[int, KafkaRecord]]]:
    """p -> (topic index, record) in the order task p took them: the committed checkpoints' runs, then (records
    beyond them, or a stateless App) the timestamp merge. `taken_in` gets, for each record a checkpoint names, that
    checkpoint (where the run committed it: what a finding about the record is best read against)."""
    queues, topics, tables = _queues(run), topics_of(run), _table_lanes(app, run)
    checkpoints = _committed_checkpoints(run, found)
    order: dict[int, list[tuple[int, KafkaRecord]]] = {}
    for p in sorted({p for _, p in queues} | checkpoints.keys()):
        taken: list[tuple[int, KafkaRecord]] = []
        positions: dict[int, int] = defaultdict(int)
        for where, checkpoint in checkpoints.get(p, []):
            before = len(taken)
            if not _take_runs(order_runs(checkpoint.order), queues, p, positions, taken, found):
                break
            if taken_in is not None:
                taken_in.update(
                    (coord(r, i), f"{where}, #{n} of p{p}") for n, (i, r) in enumerate(taken[before:], before)
                )
            streams = [topic if i not in tables else None for i, topic in enumerate(topics)]
            _runs_match_offsets(where, checkpoint, streams, queues, p, positions, found)
        order[p] = taken + _merged_rest(app, run, queues, p, positions)
    return order


def _runs_match_offsets(
    where: str,
    checkpoint: Checkpoint,
    streams: Sequence[str | None],
    queues: Mapping[tuple[int, int], list[KafkaRecord]],
    p: int,
    positions: Mapping[int, int],
    found: Findings,
) -> None:
    """The records a checkpoint's runs have taken so far in each stream are the records below the next offset it
    names for that stream: a task that moved past a record without taking it (or took one twice) committed an order
    that names other records than its offsets, and the replay would silently take the wrong ones. `streams`: the
    topics by index, None for a co-partitioned table (a take-over's restore reads a table ahead of what is taken, so
    its offset may be beyond its runs)."""
    for i, topic in enumerate(streams):
        if topic is None or topic not in checkpoint.offsets:
            continue
        queue = queues.get((i, p), [])
        below = bisect_left([r.offset for r in queue], checkpoint.offsets[topic] or 0)
        if below != positions[i]:
            found.add(
                where,
                f"{topic}: the order taken names {positions[i]} records, the next offset {checkpoint.offsets[topic]} "
                f"covers {below} (a record moved past without being taken, or taken twice)",
            )


# A transaction as the PostgreSQL sink records it (pipeline_merge_order): every topic's next offset when it began
# (topic -> offset; None: nothing taken yet), and the runs it took.
Transaction = tuple[Mapping[str, int | None], list[tuple[int, int]]]


def order_of_transactions(
    app: App, run: RunData, transactions: Mapping[int, Sequence[Transaction]], found: Findings
) -> dict[int, list[tuple[int, KafkaRecord]]]:
    """processing_order for a run whose transactions say where each began: a co-partitioned table read ahead by a
    restore (its start beyond what was taken) has the records it skipped loaded first, as the restore did; a stream
    that begins past what was taken (records skipped) or before it (taken twice) is a finding."""
    queues, topics = _queues(run), topics_of(run)
    tables = _table_lanes(app, run)
    order: dict[int, list[tuple[int, KafkaRecord]]] = {}
    for p in sorted({p for _, p in queues} | transactions.keys()):
        taken: list[tuple[int, KafkaRecord]] = []
        positions: dict[int, int] = defaultdict(int)
        for number, (start, runs) in enumerate(transactions.get(p, [])):
            for i, topic in enumerate(topics):
                queue = queues.get((i, p), [])
                at = bisect_left([r.offset for r in queue], start.get(topic) or 0)
                where = f"merge order p{p} #{number}"
                if at > positions[i] and i in tables:
                    taken += [(i, r) for r in queue[positions[i] : at]]  # what the take-over's restore read
                elif at > positions[i]:
                    found.add(
                        where,
                        f"{topic} begins at {start.get(topic)}: records from {queue[positions[i]].offset} skipped",
                    )
                elif at < positions[i]:
                    found.add(where, f"{topic} begins at {start.get(topic)}, before records taken already")
                positions[i] = at
            _take_runs(runs, queues, p, positions, taken, found)
        order[p] = taken + _merged_rest(app, run, queues, p, positions)
    return order


def _queues(run: RunData) -> dict[tuple[int, int], list[KafkaRecord]]:
    """(topic index, partition) -> its records in offset order."""
    queues: dict[tuple[int, int], list[KafkaRecord]] = defaultdict(list)
    for i, dump in enumerate([run.inputs, *run.more_inputs.values()]):
        for record in sorted(dump.records, key=lambda r: r.offset):
            queues[(i, record.partition)].append(record)
    return queues


def _table_lanes(app: App, run: RunData) -> set[int]:
    table_topics = {t.topic for t in app.table_specs.values()}
    return {i for i, topic in enumerate(topics_of(run)) if topic in table_topics}


def _take_runs(
    runs: Sequence[tuple[int, int]],
    queues: Mapping[tuple[int, int], list[KafkaRecord]],
    p: int,
    positions: dict[int, int],
    taken: list[tuple[int, KafkaRecord]],
    found: Findings,
) -> bool:
    """False when a run names records beyond the topic's (a finding)."""
    for i, count in runs:
        queue = queues.get((i, p), [])
        if positions[i] + count > len(queue):
            found.add(f"checkpoint p{p}", f"names {count} records of input {i} beyond its {len(queue)}")
            return False
        taken += [(i, r) for r in queue[positions[i] : positions[i] + count]]
        positions[i] += count
    return True


def _merged_rest(
    app: App, run: RunData, queues: Mapping[tuple[int, int], list[KafkaRecord]], p: int, positions: Mapping[int, int]
) -> list[tuple[int, KafkaRecord]]:
    """The records no committed order names, merged by timestamp (ties: tables first, then the App's order)."""
    tables = _table_lanes(app, run)
    lanes = sorted(range(len(topics_of(run))), key=lambda i: (i not in tables, i))
    rest = [[(i, r) for r in queues.get((i, p), [])[positions.get(i, 0) :]] for i in lanes]
    return list(heapq.merge(*rest, key=lambda item: item[1].timestamp_ms))


def _committed_checkpoints(run: RunData, found: Findings) -> dict[int, list[tuple[str, Checkpoint]]]:
    """p -> its committed checkpoints in changelog order, each with where it is ("checkpoint p0@12")."""
    checkpoints: dict[int, list[tuple[str, Checkpoint]]] = defaultdict(list)
    for record in sorted(run.changelog.records if run.changelog else [], key=lambda r: r.coord):
        if is_checkpoint(record.key, list(record.headers)):
            where = f"checkpoint p{record.partition}@{record.offset}"
            try:
                checkpoint = Checkpoint.decode(record.value or b"")
                order_runs(checkpoint.order)
            except (ValueError, KeyError) as e:
                found.add(f"changelog {record.partition}@{record.offset}", f"unreadable order ({e})")
                continue
            checkpoints[record.partition].append((where, checkpoint))
    return checkpoints


def fold_several(
    app: App,
    run: RunData,
    skip: Iterable[Coord],
    found: Findings,
    wall_firings: Iterable[TimerSource] = (),
    order: Mapping[int, list[tuple[int, KafkaRecord]]] | None = None,
) -> Reference:
    """app.process run offline over each partition's records in the order the run took them (`order`; None: as its
    checkpoints name it); timers fired by the rule (oracle/timers.py), at positions counted in that order."""
    reference, skipped = Reference(), set(skip)
    topics = topics_of(run)
    table_topics = {t.topic: name for name, t in app.table_specs.items()}
    global_updates = _global_updates(app, run)
    firings = reference.timers = (
        Firings(
            app,
            lambda out: encode_output(app, out),
            run.outputs.topic,
            wall_firings,
            lambda out: _held_dead_letter(app, out.headers, run, reference),
        )
        if app.timed
        else None
    )
    taken_in: dict[Coord, str] = {}
    for p, taken in (processing_order(app, run, found, taken_in) if order is None else order).items():
        state = new_state(app)
        tables = {topic: TableStore(app.table_specs[name]) for topic, name in table_topics.items()}
        globals_now = {name: TableStore(app.global_table_specs[name]) for name in app.global_table_specs}
        state.tables = {
            **{name: tables[topic].view for topic, name in table_topics.items()},
            **{name: store.view for name, store in globals_now.items()},
        }
        pending = iter(global_updates)
        update = next(pending, None)
        for position, (i, record) in enumerate(taken):
            if firings is not None:
                firings.before(cast(TimedState, state), p, position, record.timestamp_ms)
            while update is not None and update[0] <= record.timestamp_ms:  # the global tables as of this record
                globals_now[update[1]].load(update[2].key, update[2].value)
                update = next(pending, None)
            if topics[i] in tables:
                tables[topics[i]].load(record.key, record.value)
            elif (at := coord(record, i)) not in skipped:
                _fold_record(app, state, record, topics[i], at, run, reference)
                if at in reference.failures and at in taken_in:  # where the run took it: its dead letter's transaction
                    reference.failures[at] += f" [taken in {taken_in[at]}]"
        if firings is not None:
            timed = cast(TimedState, state)
            firings.walls_until(timed, p, None)
            timed.note_taken(len(taken))  # as the run's last commit wrote it
            timed.commit()
        reference.states[p] = dict(state.encoded_items())
    return reference


def _global_updates(app: App, run: RunData) -> list[tuple[int, str, KafkaRecord]]:
    updates = [(r.timestamp_ms, name, r) for name, dump in run.global_tables.items() for r in dump.records]
    return sorted(updates, key=lambda u: (u[0], u[2].partition, u[2].offset))


def _fold_record(
    app: App, state: PartitionState, record: KafkaRecord, topic: str, at: Coord, run: RunData, reference: Reference
) -> None:
    try:
        decoded = app.decode(
            record.key, record.value, topic, record.partition, record.offset, record.timestamp_ms, record.headers
        )
    except Exception as e:
        reference.failures[at] = f"decode: {type(e).__name__}: {e}"
        return
    state.begin_record()
    try:
        outputs = list(app.process(state, decoded))
        expected: list[ExpectedOutput] = []
        for out in outputs:
            if out.topic is DEAD_LETTERS:
                _held_dead_letter(app, out.headers, run, reference)
            elif out.topic in (None, run.outputs.topic):
                expected.append(encode_output(app, out))
    except Exception as e:
        state.undo_record()
        reference.failures[at] = f"process: {type(e).__name__}: {e}"
        if isinstance(e, Reject):
            reference.rejections[at] = e.error_type
        return
    state.commit()
    reference.outputs[at] = expected
    reference.outputs_to_other_topics += sum(
        1 for out in outputs if out.topic not in (None, run.outputs.topic, DEAD_LETTERS)
    )


def _held_dead_letter(app: App, headers: Iterable[tuple[str, bytes]], run: RunData, reference: Reference) -> None:
    """An output that dead-letters a record held earlier (app.dead_letter): that record needs the dead letter."""
    meta = JSON.deserialize(dict(headers)[HELD_HEADER])
    index = topics_of(run).index(app.stream(meta["topic"]).topic)
    at: Coord = (meta["partition"], meta["offset"]) if index == 0 else (meta["partition"], meta["offset"], index)
    reference.failures[at] = f"held, then dead-lettered: {meta['message']}"
    reference.rejections[at] = meta["error_type"]
    reference.outputs.pop(at, None)


def global_views(app: App, run: RunData) -> Mapping[str, TableView]:
    """The global tables as the run left them (for an App's own check)."""
    stores = {name: TableStore(spec) for name, spec in app.global_table_specs.items()}
    for _, name, record in _global_updates(app, run):
        stores[name].load(record.key, record.value)
    return {name: store.view for name, store in stores.items()}


def by_declared_names(app: App, run: RunData) -> RunData:
    """The run with its other inputs keyed by the names the App declares them by (TOPIC_SUFFIX renames the topics
    of a fault run): what an App's own check reads."""
    names = {s.topic: s.name for s in app.streams}
    return replace(run, more_inputs={names.get(topic, topic): dump for topic, dump in run.more_inputs.items()})
