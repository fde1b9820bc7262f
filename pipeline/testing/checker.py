"""The exactly-once checker: proves (or refutes) that every input record of a run had its effect exactly once.

Two layers, top to bottom:
1. plain data and the pure checks: `fold_reference` runs `app.process` offline over the input (the reference),
   and `check(app, run)` compares a `RunData` (what the run left in Kafka, as plain lists) with it. Unit tests
   feed these in-memory lists; nothing here talks to Kafka.
2. drains: `verify(app, bootstrap)` reads input, output, dead-letter and changelog topics with read_committed to
   their high watermarks, plus the group's committed offsets, into a `RunData`, then calls `check`. `Observer`
   reads the output while faults are injected; `observer_subset_of_final` checks what it saw.

What "correct" means (see "Verifying exactly-once" in EOS-CONTRACT.md), per input coordinate (partition, offset):
- it was processed offline fine: the output topic holds exactly the reference's outputs with that source, same
  key/value bytes (and partition, where the app chose one); or it went to the dead letters instead, once;
- its processing fails offline (decode or `process` raises): exactly one dead letter, no output;
- in each output partition, the outputs of one input partition appear in increasing input offset;
- the changelog's final state per partition equals the reference's; the group's committed offset and the last
  changelog checkpoint of each input partition point just past its last input record.
A record that did go to the dead letters is left out of the reference fold: a flaky failure may be dead-lettered.
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.app import App, Output, Record
from pipeline.deadletter import DeadLetter, dead_letter_topic
from pipeline.kafka.offsets import (
    EndOffsetsTimeout,
    ReadToEndTimeout,
    TailReader,
    high_watermarks,
    low_watermarks,
    read_to_end,
)
from pipeline.loading import load_app
from pipeline.provenance import decode_source
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint, changelog_topic, is_checkpoint

Coord = tuple[int, int]  # (input partition, input offset)
SAMPLE_LIMIT = 20
CATEGORIES = ("duplicates", "losses", "order", "content", "state", "offsets")


# -- plain data ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as read from a topic, detached from confluent_kafka."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0

    @property
    def coord(self) -> Coord:
        return (self.partition, self.offset)

    @property
    def source(self) -> Coord | None:
        """The input coordinate named by the eos.source header; None if absent or malformed."""
        try:
            return decode_source(self.headers)  # type: ignore[arg-type]  # a tuple of pairs reads the same
        except ValueError:
            return None


@dataclass(frozen=True)
class TopicDump:
    """Every committed record of a topic up to the high watermarks `ends` captured when the drain began."""

    topic: str
    records: list[KafkaRecord]
    ends: dict[int, int]
    exists: bool = True

    @property
    def partitions(self) -> list[int]:
        return sorted(self.ends)


@dataclass(frozen=True)
class RunData:
    """What a run left behind. `changelog` is None for a stateless app; `committed` maps input partition to the
    group's committed offset (None: nothing committed)."""

    input_topic: str
    inputs: TopicDump
    outputs: TopicDump
    dead_letters: TopicDump
    changelog: TopicDump | None
    committed: dict[int, int | None]


@dataclass(frozen=True, slots=True)
class ExpectedOutput:
    key: bytes | None
    value: bytes | None
    partition: int | None  # None: the app let the producer's partitioner choose, so it is not checked


@dataclass
class Reference:
    """The offline fold of the input: outputs per successfully processed coordinate (possibly none), the
    coordinates whose processing fails (they need a dead letter), the final encoded state per input partition."""

    outputs: dict[Coord, list[ExpectedOutput]] = field(default_factory=dict)
    failures: dict[Coord, str] = field(default_factory=dict)
    states: dict[int, dict[str, bytes]] = field(default_factory=dict)
    outputs_to_other_topics: int = 0

    def expected_count(self, coord: Coord) -> int:
        return len(self.outputs.get(coord, ()))


@dataclass(frozen=True)
class Problem:
    where: str  # "0:17" (an input coordinate), "out 1@42", "state p0 'acct-3'", "committed p0", ...
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.detail}"


@dataclass
class Findings:
    """Problems of one category: the count of all of them and the first SAMPLE_LIMIT."""

    count: int = 0
    samples: list[Problem] = field(default_factory=list)

    def add(self, where: str, detail: str) -> None:
        self.count += 1
        if len(self.samples) < SAMPLE_LIMIT:
            self.samples.append(Problem(where, detail))


@dataclass
class Verdict:
    inputs: int
    outputs: int
    dead_letters: int
    changelog_records: int
    duplicates: Findings = field(default_factory=Findings)
    losses: Findings = field(default_factory=Findings)
    order: Findings = field(default_factory=Findings)
    content: Findings = field(default_factory=Findings)
    state: Findings = field(default_factory=Findings)
    offsets: Findings = field(default_factory=Findings)
    notes: list[str] = field(default_factory=list)
    # The drained output, for observer_subset_of_final; not part of the verdict's JSON.
    final_outputs: list[KafkaRecord] = field(default_factory=list, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return all(self.findings(category).count == 0 for category in CATEGORIES)

    def findings(self, category: str) -> Findings:
        return getattr(self, category)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": {
                "inputs": self.inputs,
                "outputs": self.outputs,
                "dead_letters": self.dead_letters,
                "changelog_records": self.changelog_records,
            },
            "problems": {category: asdict(self.findings(category)) for category in CATEGORIES},
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return orjson.dumps(self.as_dict(), option=orjson.OPT_INDENT_2).decode()

    def summary(self) -> str:
        lines = [
            f"exactly-once: {'OK' if self.ok else 'FAILED'}  (inputs {self.inputs}, outputs {self.outputs}, "
            f"dead letters {self.dead_letters}, changelog records {self.changelog_records})",
            f"  {'check':<11} {'problems':>8}  first",
        ]
        for category in CATEGORIES:
            found = self.findings(category)
            first = str(found.samples[0]) if found.samples else ""
            lines.append(f"  {category:<11} {found.count:>8}  {_clip(first, 90)}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


# -- the reference fold ---------------------------------------------------------------------------------------------
def fold_reference(
    app: App, inputs: Iterable[KafkaRecord], *, input_topic: str, output_topic: str, skip: Collection[Coord] = ()
) -> Reference:
    """Runs app.process offline over each input partition in offset order, with a fresh state per partition.
    `skip`: coordinates that went to the dead letters in the run, left out as the runner left them out."""
    reference = Reference()
    states: dict[int, PartitionState] = {}
    for record in sorted(inputs, key=lambda r: r.coord):
        state = states.setdefault(record.partition, PartitionState(app.state_serde))
        if record.coord not in skip:
            _fold_one(app, state, record, input_topic, output_topic, reference)
    reference.states = {p: dict(state.encoded_items()) for p, state in states.items()}
    return reference


def _fold_one(
    app: App, state: PartitionState, record: KafkaRecord, input_topic: str, output_topic: str, reference: Reference
) -> None:
    try:
        decoded = _decode(app, record, input_topic)
    except Exception as e:
        reference.failures[record.coord] = f"decode: {type(e).__name__}: {e}"
        return
    state.begin_record()
    try:
        outputs = list(app.process(state, decoded))
        expected = [_encode(app, out) for out in outputs if out.topic in (None, output_topic)]
    except Exception as e:
        state.undo_record()
        reference.failures[record.coord] = f"process: {type(e).__name__}: {e}"
        return
    state.commit()  # keeps the undo logs small; the reference has no transactions
    reference.outputs[record.coord] = expected
    reference.outputs_to_other_topics += len(outputs) - len(expected)


def _decode(app: App, record: KafkaRecord, input_topic: str) -> Record:
    return Record(
        key=app.key_serde.deserialize(record.key),
        value=app.value_serde.deserialize(record.value),
        topic=input_topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp_ms,
        headers=record.headers,
    )


def _encode(app: App, output: Output) -> ExpectedOutput:
    return ExpectedOutput(
        key=app.output_key_serde.serialize(output.key),
        value=app.output_value_serde.serialize(output.value),
        partition=output.partition,
    )


# -- indexing what the run wrote ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    record: KafkaRecord  # where it sits in the dead-letter topic
    letter: DeadLetter


def outputs_by_source(outputs: Iterable[KafkaRecord]) -> dict[Coord, list[KafkaRecord]]:
    """Outputs grouped by their source coordinate, each group in (partition, offset) order. No source: left out."""
    grouped: dict[Coord, list[KafkaRecord]] = defaultdict(list)
    for out in sorted(outputs, key=lambda r: r.coord):
        if (source := out.source) is not None:
            grouped[source].append(out)
    return dict(grouped)


def parse_dead_letters(
    records: Iterable[KafkaRecord], input_topic: str, content: Findings
) -> dict[Coord, list[DeadLetterEntry]]:
    """Dead letters of `input_topic` grouped by the input coordinate they name. Unreadable ones are content
    problems."""
    grouped: dict[Coord, list[DeadLetterEntry]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.coord):
        where = f"dlq {record.partition}@{record.offset}"
        try:
            letter = DeadLetter.from_record(record.key, record.value, list(record.headers))
        except (KeyError, ValueError) as e:
            content.add(where, f"unreadable dead-letter headers ({type(e).__name__}: {e})")
            continue
        if letter.topic != input_topic:
            content.add(where, f"names topic {letter.topic!r}, not the input {input_topic!r}")
            continue
        grouped[(letter.partition, letter.offset)].append(DeadLetterEntry(record, letter))
    return dict(grouped)


def extra_outputs(by_source: Mapping[Coord, list[KafkaRecord]], reference: Reference) -> set[Coord]:
    """Positions (output partition, offset) of outputs beyond the reference's count for their source: the
    duplicates. The order check skips them, so one duplicate is reported once."""
    extras = set()
    for source, outs in by_source.items():
        extras.update(out.coord for out in outs[reference.expected_count(source) :])
    return extras


# -- the checks -----------------------------------------------------------------------------------------------------
def check_duplicates(
    by_source: Mapping[Coord, list[KafkaRecord]],
    dead: Mapping[Coord, list[DeadLetterEntry]],
    reference: Reference,
) -> Findings:
    found = Findings()
    for coord in sorted(by_source.keys() | dead.keys()):
        outs, letters = len(by_source.get(coord, ())), len(dead.get(coord, ()))
        if letters > 1:
            found.add(_where(coord), f"dead-lettered {letters} times")
        if letters and outs:
            found.add(_where(coord), f"dead-lettered and also has {outs} output(s)")
        elif coord in reference.outputs and outs > reference.expected_count(coord):
            found.add(_where(coord), f"{outs} outputs, the reference produces {reference.expected_count(coord)}")
    return found


def check_losses(
    input_coords: Iterable[Coord],
    by_source: Mapping[Coord, list[KafkaRecord]],
    dead: Mapping[Coord, list[DeadLetterEntry]],
    reference: Reference,
) -> Findings:
    found = Findings()
    for coord in sorted(input_coords):
        if coord in dead:
            continue
        outs = len(by_source.get(coord, ()))
        if coord in reference.failures:
            if not outs:  # outputs for a failing record are a content problem, not a loss
                found.add(_where(coord), f"no dead letter, though processing fails ({reference.failures[coord]})")
        elif outs < (expected := reference.expected_count(coord)):
            found.add(_where(coord), f"{outs} of {expected} output(s) and no dead letter")
    return found


def check_content(
    inputs: Mapping[Coord, KafkaRecord],
    outputs: Iterable[KafkaRecord],
    by_source: Mapping[Coord, list[KafkaRecord]],
    dead: Mapping[Coord, list[DeadLetterEntry]],
    reference: Reference,
    found: Findings,
) -> Findings:
    """Adds to `found` (which may already hold unreadable dead letters) and returns it."""
    for out in sorted(outputs, key=lambda r: r.coord):
        if out.source is None:
            found.add(f"out {out.partition}@{out.offset}", "no readable eos.source header")
    for coord, outs in sorted(by_source.items()):
        if coord not in inputs:
            found.add(_where(coord), f"{len(outs)} output(s) name a source that is no input record")
        elif coord in reference.failures and coord not in dead:
            found.add(_where(coord), f"has output(s), though processing fails ({reference.failures[coord]})")
        else:
            for out, expected in zip(outs, reference.outputs.get(coord, ()), strict=False):
                if mismatch := _output_mismatch(out, expected):
                    found.add(_where(coord), f"out {out.partition}@{out.offset}: {mismatch}")
    for coord, entries in sorted(dead.items()):
        for entry in entries:
            if mismatch := _dead_letter_mismatch(entry, inputs.get(coord)):
                found.add(_where(coord), f"dlq {entry.record.partition}@{entry.record.offset}: {mismatch}")
    return found


def _output_mismatch(out: KafkaRecord, expected: ExpectedOutput) -> str:
    diffs = []
    if out.key != expected.key:
        diffs.append(f"key {_clip(out.key)} != reference {_clip(expected.key)}")
    if out.value != expected.value:
        diffs.append(f"value {_clip(out.value)} != reference {_clip(expected.value)}")
    if expected.partition is not None and out.partition != expected.partition:
        diffs.append(f"partition {out.partition} != reference {expected.partition}")
    return "; ".join(diffs)


def _dead_letter_mismatch(entry: DeadLetterEntry, original: KafkaRecord | None) -> str:
    if original is None:
        return "names an offset that is no input record"
    diffs = []
    if entry.record.partition != original.partition:
        diffs.append(f"in dead-letter partition {entry.record.partition}, not {original.partition}")
    if (entry.record.key, entry.record.value) != (original.key, original.value):
        diffs.append("key/value differ from the input record")
    return "; ".join(diffs)


def check_order(outputs: Iterable[KafkaRecord], extras: Collection[Coord]) -> Findings:
    """In each output partition, the outputs of each input partition must come in non-decreasing input offset
    (several outputs of one input share its offset). Outputs of different input partitions may interleave."""
    found = Findings()
    last: dict[tuple[int, int], int] = {}  # (output partition, input partition) -> last input offset seen
    for out in sorted(outputs, key=lambda r: r.coord):
        if out.coord in extras or (source := out.source) is None:
            continue
        lane = (out.partition, source[0])
        previous = last.get(lane, -1)
        if source[1] < previous:
            found.add(
                f"out {out.partition}@{out.offset}", f"source {_where(source)} comes after {source[0]}:{previous}"
            )
        else:
            last[lane] = source[1]
    return found


def changelog_states(changelog: Iterable[KafkaRecord], found: Findings) -> dict[int, dict[str, bytes]]:
    """Final state per changelog partition: last write wins per key, a record without value deletes."""
    states: dict[int, dict[str, bytes]] = defaultdict(dict)
    for record in sorted(changelog, key=lambda r: r.coord):
        if is_checkpoint(record.key, list(record.headers)):
            continue
        try:
            key = record.key.decode() if record.key is not None else None
        except UnicodeDecodeError:
            key = None
        if key is None:
            found.add(f"changelog {record.partition}@{record.offset}", "state key missing or not UTF-8")
        elif record.value is None:
            states[record.partition].pop(key, None)
        else:
            states[record.partition][key] = record.value
    return dict(states)


def check_state(changelog: TopicDump, input_partitions: Sequence[int], reference: Reference) -> Findings:
    found = Findings()
    if changelog.partitions != list(input_partitions):
        found.add(
            f"topic {changelog.topic}", f"partitions {changelog.partitions}, the input has {list(input_partitions)}"
        )
    actual = changelog_states(changelog.records, found)
    for p in sorted(set(input_partitions) | actual.keys()):
        _compare_states(p, actual.get(p, {}), reference.states.get(p, {}), found)
    return found


def _compare_states(p: int, actual: dict[str, bytes], expected: dict[str, bytes], found: Findings) -> None:
    for key in sorted(actual.keys() | expected.keys()):
        have, want = actual.get(key), expected.get(key)
        if have != want:
            found.add(f"state p{p} {key!r}", f"changelog {_clip(have)} != reference {_clip(want)}")


def last_checkpoints(changelog: Iterable[KafkaRecord], found: Findings) -> dict[int, Checkpoint]:
    checkpoints = {}
    for record in sorted(changelog, key=lambda r: r.coord):
        if not is_checkpoint(record.key, list(record.headers)):
            continue
        try:
            checkpoints[record.partition] = Checkpoint.decode(record.value or b"")
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            found.add(f"changelog {record.partition}@{record.offset}", f"unreadable checkpoint ({e})")
    return checkpoints


def check_offsets(run: RunData) -> Findings:
    """Committed offset and last checkpoint of input partition p must point past its last input record: 1 + that
    offset, or further but only over offsets without data (commit markers of a transactional input). And they
    must agree (rule 7); that is reported only when both are plausible, so one wrong offset is one problem."""
    found = Findings()
    last_data: dict[int, int] = {}
    for record in run.inputs.records:
        last_data[record.partition] = max(record.offset, last_data.get(record.partition, -1))
    checkpoints = last_checkpoints(run.changelog.records, found) if run.changelog is not None else None
    for p in run.inputs.partitions:
        lowest, end = (last_data[p] + 1 if p in last_data else None), run.inputs.ends[p]
        committed = run.committed.get(p)
        committed_ok = _check_next_offset(found, f"committed p{p}", committed, lowest, end)
        if checkpoints is None:
            continue
        checkpoint = checkpoints.get(p)
        next_offset = checkpoint.next_input_offset if checkpoint else None
        checkpoint_ok = _check_next_offset(found, f"checkpoint p{p}", next_offset, lowest, end)
        if checkpoint_ok and committed_ok and next_offset != committed:
            found.add(f"checkpoint p{p}", f"{next_offset}, but the committed offset is {committed}")
        if checkpoint and (checkpoint.input_topic, checkpoint.input_partition) != (run.input_topic, p):
            found.add(f"checkpoint p{p}", f"names {checkpoint.input_topic}:{checkpoint.input_partition}")
    return found


def _check_next_offset(found: Findings, where: str, actual: int | None, lowest: int | None, end: int) -> bool:
    """Whether `actual` is a correct next offset for a partition whose data ends at lowest - 1 (None: no data)."""
    if lowest is None:  # no input records: nothing needs to be committed
        if actual is not None and actual > end:
            found.add(where, f"{actual}, beyond the end {end} of an empty partition")
            return False
        return True
    if actual is None or not lowest <= actual <= end:
        expected = f"{lowest}" if lowest == end else f"{lowest} (or up to {end} past trailing markers)"
        found.add(where, f"{actual if actual is not None else 'nothing'}, expected {expected}")
        return False
    return True


def check(app: App, run: RunData) -> Verdict:
    """All checks over what a run left behind. Pure: no Kafka."""
    verdict = Verdict(
        inputs=len(run.inputs.records),
        outputs=len(run.outputs.records),
        dead_letters=len(run.dead_letters.records),
        changelog_records=len(run.changelog.records) if run.changelog is not None else 0,
        final_outputs=run.outputs.records,
    )
    inputs = {record.coord: record for record in run.inputs.records}
    dead = parse_dead_letters(run.dead_letters.records, run.input_topic, verdict.content)
    reference = fold_reference(
        app, run.inputs.records, input_topic=run.input_topic, output_topic=run.outputs.topic, skip=dead.keys()
    )
    by_source = outputs_by_source(run.outputs.records)
    verdict.duplicates = check_duplicates(by_source, dead, reference)
    verdict.losses = check_losses(inputs.keys(), by_source, dead, reference)
    verdict.order = check_order(run.outputs.records, extra_outputs(by_source, reference))
    check_content(inputs, run.outputs.records, by_source, dead, reference, verdict.content)
    if run.changelog is not None:
        verdict.state = check_state(run.changelog, run.inputs.partitions, reference)
    verdict.offsets = check_offsets(run)
    verdict.notes = _notes(run, reference)
    return verdict


def _notes(run: RunData, reference: Reference) -> list[str]:
    notes = [f"topic {dump.topic} does not exist: read as empty" for dump in _dumps(run) if not dump.exists]
    if reference.outputs_to_other_topics:
        notes.append(f"{reference.outputs_to_other_topics} reference outputs go to other topics: not checked")
    if any(e.partition is None for outs in reference.outputs.values() for e in outs):
        notes.append("the app leaves output partitions to the partitioner: output partitions not checked")
    if run.changelog is None:
        notes.append("stateless app: state and checkpoints not checked")
    return notes


def _dumps(run: RunData) -> list[TopicDump]:
    dumps = [run.inputs, run.outputs, run.dead_letters]
    return [*dumps, run.changelog] if run.changelog is not None else dumps


def _where(coord: Coord) -> str:
    return f"{coord[0]}:{coord[1]}"


def _clip(data: object, limit: int = 60) -> str:
    text = data if isinstance(data, str) else repr(data)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- draining Kafka ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dead_letter: str
    changelog: str | None  # None: stateless app

    @staticmethod
    def for_app(
        app: App,
        *,
        input_topic: str | None = None,
        output_topic: str | None = None,
        dead_letter_topic_name: str | None = None,
        changelog_topic_name: str | None = None,
    ) -> Topics:
        return Topics(
            input=input_topic or app.input_topic,
            output=output_topic or app.output_topic,
            dead_letter=dead_letter_topic_name or dead_letter_topic(app.name),
            changelog=(changelog_topic_name or changelog_topic(app.name)) if app.stateful else None,
        )


def verify(
    app: App,
    bootstrap: str,
    *,
    input_topic: str | None = None,
    output_topic: str | None = None,
    dead_letter_topic: str | None = None,
    changelog_topic: str | None = None,
    group_id: str | None = None,
    timeout_s: float = 60.0,
    extra_config: Mapping[str, Any] | None = None,
) -> Verdict:
    """Drains what the run left in Kafka and checks it. `timeout_s` bounds each drain (they run in parallel) and
    each metadata or offsets request. `extra_config` (security etc.) goes to every client. Raises
    ReadToEndTimeout if a topic cannot be read to its end (an open transaction: verify after the run stopped)."""
    topics = Topics.for_app(
        app,
        input_topic=input_topic,
        output_topic=output_topic,
        dead_letter_topic_name=dead_letter_topic,
        changelog_topic_name=changelog_topic,
    )
    config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
    run = drain_run(config, topics, group_id or app.name, timeout_s)
    return check(app, run)


def drain_run(config: Mapping[str, Any], topics: Topics, group_id: str, timeout_s: float) -> RunData:
    admin = AdminClient(dict(config))
    names = [topics.input, topics.output, topics.dead_letter]
    if topics.changelog is not None:
        names.append(topics.changelog)
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="eos-drain") as pool:
        dumps = list(pool.map(lambda topic: drain_topic(admin, config, topic, timeout_s), names))
    inputs = dumps[0]
    if not inputs.exists:
        raise LookupError(f"input topic {topics.input} does not exist")
    return RunData(
        input_topic=topics.input,
        inputs=inputs,
        outputs=dumps[1],
        dead_letters=dumps[2],
        changelog=dumps[3] if topics.changelog is not None else None,
        committed=committed_offsets(config, group_id, topics.input, inputs.partitions, timeout_s),
    )


def drain_topic(admin: AdminClient, config: Mapping[str, Any], topic: str, timeout_s: float) -> TopicDump:
    """Every committed record of `topic`, read with a dedicated read_committed consumer up to the high watermarks."""
    partitions = topic_partitions(admin, topic, timeout_s)
    if partitions is None:
        return TopicDump(topic, [], {}, exists=False)
    starts = low_watermarks(admin, topic, partitions, timeout_s)
    ends = high_watermarks(admin, topic, partitions, timeout_s)
    consumer = Consumer(reader_config(config))
    try:
        reader = TailReader(consumer, topic, starts, ends)
        records = [_detach(message) for message in read_to_end(reader, timeout_s)]
    finally:
        consumer.close()
    return TopicDump(topic, records, ends)


def topic_partitions(admin: AdminClient, topic: str, timeout_s: float) -> list[int] | None:
    """The partitions of `topic`; None if it does not exist."""
    metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or (metadata.error and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if metadata.error:
        raise KafkaException(metadata.error)
    return sorted(metadata.partitions)


def reader_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A consumer that only reads by assignment: throwaway group (librdkafka wants one), nothing ever committed."""
    return {
        **config,
        "group.id": f"eos-checker-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }


def committed_offsets(
    config: Mapping[str, Any], group_id: str, topic: str, partitions: Sequence[int], timeout_s: float
) -> dict[int, int | None]:
    """The group's committed offset per partition (None: none). Joins no group and commits nothing."""
    consumer = Consumer({**config, "group.id": group_id, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    finally:
        consumer.close()
    for tp in committed:
        if tp.error:
            raise KafkaException(tp.error)
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in committed}


def _detach(message: Any) -> KafkaRecord:
    return KafkaRecord(
        partition=message.partition(),
        offset=message.offset(),
        key=message.key(),
        value=message.value(),
        headers=tuple(message.headers() or ()),
        timestamp_ms=message.timestamp()[1],
    )


# -- the concurrent observer --------------------------------------------------------------------------------------
class Observer:
    """Reads a topic with read_committed in a background thread, from its beginning, until stopped, and keeps
    every record it sees. The contract: none of them may be missing from the final drain."""

    def __init__(
        self, bootstrap: str, topic: str, *, extra_config: Mapping[str, Any] | None = None, timeout_s: float = 30.0
    ) -> None:
        self.topic = topic
        self.records: list[KafkaRecord] = []
        self.errors: list[str] = []  # fatal consumer errors; transient ones (broker restarts) are expected
        self._config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
        self._timeout_s = timeout_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"eos-observer-{topic}", daemon=True)
        self._partitions: list[int] = []

    def start(self) -> Observer:
        partitions = topic_partitions(AdminClient(dict(self._config)), self.topic, self._timeout_s)
        if partitions is None:
            raise LookupError(f"cannot observe {self.topic}: it does not exist")
        self._partitions = partitions
        self._thread.start()
        return self

    def stop(self) -> list[KafkaRecord]:
        self._stopping.set()
        self._thread.join(self._timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"observer of {self.topic} did not stop within {self._timeout_s}s")
        return self.records

    def __enter__(self) -> Observer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        consumer = Consumer(reader_config(self._config))
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self._partitions])
            while not self._stopping.is_set():
                for message in consumer.consume(num_messages=1000, timeout=0.2):
                    if message.error() is None:
                        self.records.append(_detach(message))
                    elif message.error().fatal():
                        self.errors.append(str(message.error()))
                        return
        finally:
            consumer.close()


def observe(
    bootstrap: str, topic: str, *, extra_config: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> Observer:
    """Starts an Observer of `topic` (which must exist); `stop()` it after the fault run, before `verify`."""
    return Observer(bootstrap, topic, extra_config=extra_config, timeout_s=timeout_s).start()


def observer_subset_of_final(
    observed: Iterable[KafkaRecord], final: Verdict | Iterable[KafkaRecord]
) -> list[KafkaRecord]:
    """Records the observer saw that the final drain does not hold (same position, same bytes). Must be empty:
    a read_committed reader must never see what is later gone (a zombie's output, an aborted transaction)."""
    final_records = final.final_outputs if isinstance(final, Verdict) else final
    by_position = {record.coord: record for record in final_records}
    return [record for record in observed if by_position.get(record.coord) != record]


# -- command line ------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`pipeline verify MODULE:ATTR --bootstrap-servers ...`: 0 if exactly-once holds, 1 if not, 2 if the run
    could not be checked (a topic not readable to its end, the broker not answering, a bad app path)."""
    args = _parser().parse_args(_without_command(argv if argv is not None else sys.argv[1:]))
    try:
        verdict = verify(
            load_app(args.app),
            args.bootstrap_servers,
            input_topic=args.input_topic,
            output_topic=args.output_topic,
            dead_letter_topic=args.dead_letter_topic,
            changelog_topic=args.changelog_topic,
            group_id=args.group_id,
            timeout_s=args.timeout,
        )
    except (ReadToEndTimeout, EndOffsetsTimeout, KafkaException, LookupError, ValueError, TypeError) as e:
        print(f"pipeline verify: could not check: {e}", file=sys.stderr)
        return 2
    print(verdict.to_json() if args.json else verdict.summary())
    return 0 if verdict.ok else 1


def _without_command(argv: Sequence[str]) -> list[str]:
    return list(argv[1:]) if argv and argv[0] == "verify" else list(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline verify", description="Check a finished run for exactly-once.")
    parser.add_argument("app", help="the App by import path, e.g. pipeline.examples.running_totals:app")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--input-topic")
    parser.add_argument("--output-topic")
    parser.add_argument("--dead-letter-topic")
    parser.add_argument("--changelog-topic")
    parser.add_argument("--group-id", help="default: the app's name")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per drain (default 60)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser


if __name__ == "__main__":
    sys.exit(main())
