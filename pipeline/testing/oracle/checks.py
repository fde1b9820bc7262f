"""The checks: what the run wrote (outputs by source, dead letters, changelog, offsets) against the reference.

Each check returns the Findings of one category; `check` runs them all over a RunData. Pure: no Kafka.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.app import App
from pipeline.core.deadletter import DeadLetter
from pipeline.core.provenance import TIMER_HEADER, decode_timer
from pipeline.state.changelog import is_checkpoint
from pipeline.testing.oracle.inputs import GLOBAL_TABLE_NOTE, all_inputs, by_declared_names, fold_several, topics_of
from pipeline.testing.oracle.offsets import check_offsets, check_offsets_several
from pipeline.testing.oracle.records import Coord, ExpectedOutput, KafkaRecord, RunData, TopicDump
from pipeline.testing.oracle.reference import Reference, fold_reference
from pipeline.testing.oracle.timers import check_timers, comparable, timer_dead_letters, timer_outputs
from pipeline.testing.oracle.verdict import Findings, Verdict, clip, coord_name


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
    records: Iterable[KafkaRecord], input_topic: str | Sequence[str], content: Findings
) -> dict[Coord, list[DeadLetterEntry]]:
    """Dead letters of `input_topic` (or of several inputs: a record of the i-th has coordinate (partition, offset,
    i)) grouped by the input coordinate they name. Unreadable ones are content problems."""
    topics = [input_topic] if isinstance(input_topic, str) else list(input_topic)
    grouped: dict[Coord, list[DeadLetterEntry]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.coord):
        where = f"dlq {record.partition}@{record.offset}"
        try:
            letter = DeadLetter.from_record(record.key, record.value, list(record.headers))
        except (KeyError, ValueError) as e:
            content.add(where, f"unreadable dead-letter headers ({type(e).__name__}: {e})")
            continue
        if letter.timer:  # a timer's, not an input record's: oracle/timers.py checks it
            continue
        if letter.topic not in topics:
            content.add(where, f"names topic {letter.topic!r}, not the input {' or '.join(topics)!r}")
            continue
        index = topics.index(letter.topic)
        at: Coord = (letter.partition, letter.offset) if index == 0 else (letter.partition, letter.offset, index)
        grouped[at].append(DeadLetterEntry(record, letter))
    return dict(grouped)


def extra_outputs(by_source: Mapping[Coord, list[KafkaRecord]], reference: Reference) -> set[Coord]:
    """Positions (output partition, offset) of outputs beyond the reference's count for their source: the
    duplicates. The order check skips them, so one duplicate is reported once."""
    extras: set[Coord] = set()
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
            found.add(coord_name(coord), f"dead-lettered {letters} times")
        if letters and outs:
            found.add(coord_name(coord), f"dead-lettered and also has {outs} output(s)")
        elif coord in reference.outputs and outs > reference.expected_count(coord):
            found.add(coord_name(coord), f"{outs} outputs, the reference produces {reference.expected_count(coord)}")
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
                found.add(coord_name(coord), f"no dead letter, though processing fails ({reference.failures[coord]})")
        elif outs < (expected := reference.expected_count(coord)):
            found.add(coord_name(coord), f"{outs} of {expected} output(s) and no dead letter")
    return found


def check_content(
    inputs: Mapping[Coord, KafkaRecord],
    outputs: Iterable[KafkaRecord],
    by_source: Mapping[Coord, list[KafkaRecord]],
    dead: Mapping[Coord, list[DeadLetterEntry]],
    reference: Reference,
    found: Findings,
    compare_values: bool = True,
) -> Findings:
    """Adds to `found` (which may already hold unreadable dead letters) and returns it. Without `compare_values`,
    outputs are compared by key and partition only (an App reading global tables: see oracle/inputs.py)."""
    for out in sorted(outputs, key=lambda r: r.coord):
        if out.source is None and not any(name == TIMER_HEADER for name, _ in out.headers):
            found.add(f"out {out.partition}@{out.offset}", "no readable eos.source header")
    for coord, outs in sorted(by_source.items()):
        if coord not in inputs:
            found.add(coord_name(coord), f"{len(outs)} output(s) name a source that is no input record")
        elif coord in reference.failures and coord not in dead:
            found.add(coord_name(coord), f"has output(s), though processing fails ({reference.failures[coord]})")
        else:
            for out, expected in zip(outs, reference.outputs.get(coord, ()), strict=False):
                if not compare_values:
                    expected = ExpectedOutput(expected.key, out.value, expected.partition)
                if mismatch := _output_mismatch(out, expected):
                    found.add(coord_name(coord), f"out {out.partition}@{out.offset}: {mismatch}")
    for coord, entries in sorted(dead.items()):
        for entry in entries:
            mismatch = _dead_letter_mismatch(entry, inputs.get(coord)) or _rejection_mismatch(entry, coord, reference)
            if mismatch:
                found.add(coord_name(coord), f"dlq {entry.record.partition}@{entry.record.offset}: {mismatch}")
    return found


def _rejection_mismatch(entry: DeadLetterEntry, coord: Coord, reference: Reference) -> str:
    """A dead letter `process` wrote on purpose (Reject) must be one the reference writes too, of the same type."""
    if not entry.letter.rejected:
        return ""
    expected = reference.rejections.get(coord)
    if expected is None:
        return f"rejected as {entry.letter.error_type!r}, but the reference does not reject it"
    return (
        ""
        if expected == entry.letter.error_type
        else f"rejected as {entry.letter.error_type!r}, the reference rejects it as {expected!r}"
    )


def _output_mismatch(out: KafkaRecord, expected: ExpectedOutput) -> str:
    diffs = []
    if out.key != expected.key:
        diffs.append(f"key {clip(out.key)} != reference {clip(expected.key)}")
    if out.value != expected.value:
        diffs.append(f"value {clip(out.value)} != reference {clip(expected.value)}")
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


def check_order(outputs: Iterable[KafkaRecord], extras: Collection[Coord], merged_positions: bool = False) -> Findings:
    """In each output partition, the outputs of each input partition must come in non-decreasing input offset
    (several outputs of one input share its offset). Outputs of different input partitions may interleave.
    `merged_positions`: an App with several inputs, whose timer firings are placed by their position in p's merge,
    not by an input offset: their outputs are a lane of their own, in non-decreasing position."""
    found = Findings()
    last: dict[tuple[int, int, int], int] = {}  # (output partition, input partition, input) -> last offset seen
    for out in sorted(outputs, key=lambda r: r.coord):
        if out.coord in extras or (source := _order_source(out)) is None:
            continue
        lane = (out.partition, source[0], source[2] if len(source) > 2 else 0)  # each input partition's own
        if merged_positions and out.source is None:
            lane = (out.partition, source[0], -1)  # a timer's: positions in the merge
        previous = last.get(lane, -1)
        if source[1] < previous:
            found.add(
                f"out {out.partition}@{out.offset}", f"source {coord_name(source)} comes after {source[0]}:{previous}"
            )
        else:
            last[lane] = source[1]
    return found


def _order_source(out: KafkaRecord) -> Coord | None:
    """The input coordinate an output is ordered by: its source record's, or for a timer's output the position
    (input offset) before which the timer fired."""
    if (source := out.source) is not None:
        return source
    try:
        firing = decode_timer(out.headers)
    except ValueError:
        return None
    return None if firing is None else (firing.partition, firing.position)


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


def check_state(
    changelog: TopicDump, input_partitions: Sequence[int], reference: Reference, app: App | None = None
) -> Findings:
    """The changelog's final state per partition against the reference's (for an App with wall-clock timers: those
    compared by payload only, see pipeline/testing/oracle/timers.py)."""
    found = Findings()
    if changelog.partitions != list(input_partitions):
        found.add(
            f"topic {changelog.topic}", f"partitions {changelog.partitions}, the input has {list(input_partitions)}"
        )
    actual = changelog_states(changelog.records, found)
    for p in sorted(set(input_partitions) | actual.keys()):
        have, want = actual.get(p, {}), reference.states.get(p, {})
        if app is not None:
            have, want = comparable(app, have), comparable(app, want)
        compare_states(p, have, want, found)
    return found


def compare_states(p: int, actual: dict[str, bytes], expected: dict[str, bytes], found: Findings) -> None:
    for key in sorted(actual.keys() | expected.keys()):
        have, want = actual.get(key), expected.get(key)
        if have != want:
            found.add(f"state p{p} {key!r}", f"changelog {clip(have)} != reference {clip(want)}")


def check(app: App, run: RunData) -> Verdict:
    """All checks over what a run left behind. Pure: no Kafka."""
    verdict = Verdict(
        inputs=len(run.inputs.records) + sum(len(dump.records) for dump in run.more_inputs.values()),
        outputs=len(run.outputs.records),
        dead_letters=len(run.dead_letters.records),
        changelog_records=len(run.changelog.records) if run.changelog is not None else 0,
        final_outputs=run.outputs.records,
    )
    several = bool(run.more_inputs) or app.multi_input  # docs/inputs.md: oracle/inputs.py
    inputs = all_inputs(run) if several else {record.coord: record for record in run.inputs.records}
    dead = parse_dead_letters(run.dead_letters.records, topics_of(run), verdict.content)
    by_firing = timer_outputs(run.outputs.records, verdict.content)
    # A record rejected on purpose is folded all the same: the reference must reject it too.
    skip = {coord for coord, entries in dead.items() if not all(e.letter.rejected for e in entries)}
    if several:
        walls = [f for f in by_firing if f.clock == "wall"]
        reference = fold_several(app, run, skip, verdict.content, walls)
    else:
        reference = fold_reference(
            app,
            run.inputs.records,
            input_topic=run.input_topic,
            output_topic=run.outputs.topic,
            skip=skip,
            wall_firings=[f for f in by_firing if f.clock == "wall"],
        )
    by_source = outputs_by_source(run.outputs.records)
    verdict.duplicates = check_duplicates(by_source, dead, reference)
    verdict.losses = check_losses(inputs.keys(), by_source, dead, reference)
    timer_dead = timer_dead_letters(run.dead_letters.records)
    timers = reference.timers
    timer_extras = check_timers(by_firing, timers, verdict, _output_mismatch, timer_dead) if timers else set()
    extras = extra_outputs(by_source, reference) | timer_extras
    verdict.order = check_order(run.outputs.records, extras, merged_positions=several)
    values = not app.global_tables  # values read from a global table are the App's own check's business
    check_content(inputs, run.outputs.records, by_source, dead, reference, verdict.content, values)
    if run.changelog is not None:
        verdict.state = check_state(run.changelog, run.inputs.partitions, reference, app)
    verdict.offsets = check_offsets_several(run) if several else check_offsets(run)
    for problem in app.check(by_declared_names(app, run)) if app.check is not None else ():
        where, _, detail = problem.partition(": ")
        verdict.app.add(where, detail or where)
    verdict.notes = _notes(run, reference) + ([] if values else [GLOBAL_TABLE_NOTE])
    return verdict


def _notes(run: RunData, reference: Reference) -> list[str]:
    notes = [f"topic {dump.topic} does not exist: read as empty" for dump in run.dumps() if not dump.exists]
    if reference.outputs_to_other_topics:
        notes.append(f"{reference.outputs_to_other_topics} reference outputs go to other topics: not checked")
    if any(e.partition is None for outs in reference.outputs.values() for e in outs):
        notes.append("the app leaves output partitions to the partitioner: output partitions not checked")
    if run.changelog is None:
        notes.append("stateless app: state and checkpoints not checked")
    return notes


def observer_subset_of_final(
    observed: Iterable[KafkaRecord], final: Verdict | Iterable[KafkaRecord]
) -> list[KafkaRecord]:
    """Records the observer saw that the final drain does not hold (same position, same bytes). Must be empty:
    a read_committed reader must never see what is later gone (a zombie's output, an aborted transaction)."""
    final_records = final.final_outputs if isinstance(final, Verdict) else final
    by_position = {record.coord: record for record in final_records}
    return [record for record in observed if by_position.get(record.coord) != record]
