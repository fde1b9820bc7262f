"""The checker's pure part, fed in-memory runs: a correct run passes, and each kind of damage is found exactly once."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

import orjson
import pytest

from pipeline.app import App, Output
from pipeline.core.deadletter import DeadLetter
from pipeline.core.provenance import SOURCE_HEADER, encode_source
from pipeline.examples import copier, running_totals
from pipeline.loading import load_app
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.testing.inputs import copier_records, running_totals_records
from pipeline.testing.oracle import (
    SAMPLE_LIMIT,
    Findings,
    KafkaRecord,
    RunData,
    TopicDump,
    Verdict,
    check,
    fold_reference,
    observer_subset_of_final,
)

IN, OUT = "in", "out"
TOTALS = running_totals.app


# -- building runs in memory ---------------------------------------------------------------------------------------
def deposit(partition: int, offset: int, account: str, amount: object, id_: int | None = None) -> KafkaRecord:
    value = orjson.dumps({"id": offset if id_ is None else id_, "amount": amount})
    return KafkaRecord(partition, offset, account.encode(), value)


def totals_inputs() -> list[KafkaRecord]:
    """Two partitions; 0:3 is invalid JSON, 1:2 makes process raise."""
    return [
        deposit(0, 0, "a", 5),
        deposit(0, 1, "b", 1),
        deposit(0, 2, "a", 7),
        KafkaRecord(0, 3, b"a", b'{"id": 3, "amount": '),
        deposit(0, 4, "b", 2),
        deposit(1, 0, "c", 10),
        deposit(1, 1, "c", -3),
        deposit(1, 2, "c", "not-a-number"),
        deposit(1, 3, "d", 4),
    ]


class Appender:
    """Appends records to a topic in memory, numbering offsets per partition."""

    def __init__(self) -> None:
        self.records: list[KafkaRecord] = []
        self.next: dict[int, int] = defaultdict(int)

    def add(self, partition: int, key: bytes | None, value: bytes | None, headers=()) -> None:
        self.records.append(KafkaRecord(partition, self.next[partition], key, value, tuple(headers)))
        self.next[partition] += 1

    def dump(self, topic: str, partitions: Iterable[int]) -> TopicDump:
        return TopicDump(topic, self.records, {p: self.next[p] for p in partitions})


def correct_run(app: App, inputs: list[KafkaRecord], *, partitions=(0, 1), also_dead: Iterable = ()) -> RunData:
    """What a correct runner leaves behind: outputs, dead letters for failing records (and `also_dead`), changelog
    with a final checkpoint, committed offsets."""
    also_dead = set(also_dead)
    reference = fold_reference(app, inputs, input_topic=IN, output_topic=OUT, skip=also_dead)
    by_coord = {r.coord: r for r in inputs}
    outputs, dead, changelog = Appender(), Appender(), Appender()
    for coord in sorted(reference.outputs):
        for expected in reference.outputs[coord]:
            partition = coord[0] if expected.partition is None else expected.partition
            outputs.add(partition, expected.key, expected.value, [(SOURCE_HEADER, encode_source(*coord))])
    for coord in sorted(reference.failures.keys() | also_dead):
        original = by_coord[coord]
        letter = DeadLetter(IN, coord[0], coord[1], original.key, original.value, "E", "boom", 3)
        dead.add(coord[0], original.key, original.value, letter.headers())
    next_offsets = {p: max(r.offset for r in inputs if r.partition == p) + 1 for p in partitions}
    for p in partitions:
        for key, value in reference.states.get(p, {}).items():
            changelog.add(p, key.encode(), value)
        changelog.add(p, CHECKPOINT_KEY, Checkpoint(IN, p, next_offsets[p]).encode(), [CHECKPOINT_HEADER])
    return RunData(
        input_topic=IN,
        inputs=TopicDump(IN, list(inputs), dict(next_offsets)),
        outputs=outputs.dump(OUT, partitions),
        dead_letters=dead.dump(f"{app.name}-dlq", partitions),
        changelog=changelog.dump(f"{app.name}-changelog", partitions) if app.stateful else None,
        committed=dict(next_offsets),
    )


def with_outputs(run: RunData, records: list[KafkaRecord]) -> RunData:
    return replace(run, outputs=replace(run.outputs, records=records))


def problem_counts(verdict: Verdict) -> dict[str, int]:
    counts = {name: verdict.findings(name).count for name in ("duplicates", "losses", "order", "content")}
    counts |= {name: verdict.findings(name).count for name in ("state", "offsets")}
    return {name: count for name, count in counts.items() if count}


def first_where(verdict: Verdict, category: str) -> str:
    return verdict.findings(category).samples[0].where


# -- the reference fold --------------------------------------------------------------------------------------------
def test_reference_fold_computes_running_totals_and_expects_dead_letters_for_poison():
    reference = fold_reference(TOTALS, totals_inputs(), input_topic=IN, output_topic=OUT)

    assert [e.value for e in reference.outputs[(0, 2)]] == [b'{"id":2,"count":2,"sum":12}']
    assert reference.outputs[(0, 2)][0].key == b"a"
    assert reference.outputs[(0, 4)][0].value == b'{"id":4,"count":2,"sum":3}'
    assert reference.outputs[(1, 3)][0].value == b'{"id":3,"count":1,"sum":4}'
    assert set(reference.failures) == {(0, 3), (1, 2)}
    assert reference.failures[(0, 3)].startswith("decode")
    assert reference.failures[(1, 2)].startswith("process: TypeError")
    # the failing record left no trace in the state
    assert reference.states == {0: {"a": b"[2,12]", "b": b"[2,3]"}, 1: {"c": b"[2,7]", "d": b"[1,4]"}}


def test_reference_fold_leaves_out_dead_lettered_records():
    reference = fold_reference(TOTALS, totals_inputs(), input_topic=IN, output_topic=OUT, skip={(0, 0)})

    assert (0, 0) not in reference.outputs
    assert reference.outputs[(0, 2)][0].value == b'{"id":2,"count":1,"sum":7}'


def test_outputs_to_other_topics_are_not_expected_on_the_output_topic():
    def fan_out(state, record):
        return [Output(value=record.value), Output(value=record.value, topic="audit")]

    app = App("fan", IN, OUT, fan_out, stateful=False)
    reference = fold_reference(app, [deposit(0, 0, "a", 1)], input_topic=IN, output_topic=OUT)

    assert len(reference.outputs[(0, 0)]) == 1
    assert reference.outputs_to_other_topics == 1


# -- a correct run passes ------------------------------------------------------------------------------------------
def test_a_correct_run_is_ok():
    verdict = check(TOTALS, correct_run(TOTALS, totals_inputs()))

    assert verdict.ok, verdict.summary()
    assert (verdict.inputs, verdict.outputs, verdict.dead_letters) == (9, 7, 2)
    assert verdict.changelog_records == 4 + 2


def test_a_good_record_dead_lettered_by_a_flaky_failure_is_ok():
    run = correct_run(TOTALS, totals_inputs(), also_dead={(0, 0)})

    verdict = check(TOTALS, run)

    assert verdict.ok, verdict.summary()
    assert verdict.dead_letters == 3


def test_several_outputs_per_input_and_none_are_ok():
    def split(state, record):
        return [Output(value={"part": i}, key=record.key) for i in range(record.value["amount"])]

    app = App("split", IN, OUT, split, stateful=False)
    inputs = [deposit(0, 0, "a", 2), deposit(0, 1, "a", 0), deposit(0, 2, "a", 3)]

    verdict = check(app, correct_run(app, inputs, partitions=(0,)))

    assert verdict.ok, verdict.summary()
    assert verdict.outputs == 5


# -- each kind of damage, found once -------------------------------------------------------------------------------
def test_a_duplicated_output_is_a_duplicate_only():
    run = correct_run(TOTALS, totals_inputs())
    copy = run.outputs.records[1]  # source 0:1
    run = with_outputs(run, [*run.outputs.records, replace(copy, offset=99)])

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"duplicates": 1}
    assert first_where(verdict, "duplicates") == "0:1"


def test_a_duplicated_transaction_replayed_later_is_duplicates_only():
    run = correct_run(TOTALS, totals_inputs())
    p0 = [r for r in run.outputs.records if r.partition == 0]
    replayed = [replace(r, offset=100 + i) for i, r in enumerate(p0[:2])]
    verdict = check(TOTALS, with_outputs(run, [*run.outputs.records, *replayed]))

    assert problem_counts(verdict) == {"duplicates": 2}


def test_a_dead_lettered_record_that_also_has_an_output_is_a_duplicate():
    run = correct_run(TOTALS, totals_inputs(), also_dead={(1, 3)})
    complete = correct_run(TOTALS, totals_inputs())
    output_of_1_3 = next(r for r in complete.outputs.records if r.source == (1, 3))
    run = with_outputs(run, [*run.outputs.records, replace(output_of_1_3, offset=50)])

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"duplicates": 1}
    assert "also has 1 output" in verdict.duplicates.samples[0].detail


def test_a_record_dead_lettered_twice_is_a_duplicate():
    run = correct_run(TOTALS, totals_inputs())
    letter = run.dead_letters.records[0]
    run = replace(
        run, dead_letters=replace(run.dead_letters, records=[*run.dead_letters.records, replace(letter, offset=7)])
    )

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"duplicates": 1}
    assert "dead-lettered 2 times" in verdict.duplicates.samples[0].detail


def test_a_missing_output_is_a_loss_only():
    run = correct_run(TOTALS, totals_inputs())
    run = with_outputs(run, [r for r in run.outputs.records if r.source != (1, 1)])

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"losses": 1}
    assert first_where(verdict, "losses") == "1:1"


def test_a_failing_record_without_dead_letter_is_a_loss():
    run = correct_run(TOTALS, totals_inputs())
    letters = [
        r for r in run.dead_letters.records if DeadLetter.from_record(r.key, r.value, list(r.headers)).offset != 3
    ]
    run = replace(run, dead_letters=replace(run.dead_letters, records=letters))

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"losses": 1}
    assert first_where(verdict, "losses") == "0:3"


def test_swapped_outputs_are_an_order_problem_only():
    run = correct_run(TOTALS, totals_inputs())
    records = list(run.outputs.records)
    first, second = records[0], records[1]  # sources 0:0 and 0:1, output partition 0
    records[0], records[1] = replace(second, offset=first.offset), replace(first, offset=second.offset)

    verdict = check(TOTALS, with_outputs(run, records))

    assert problem_counts(verdict) == {"order": 1}
    assert first_where(verdict, "order") == "out 0@1"


def test_outputs_of_different_input_partitions_may_interleave():
    run = correct_run(TOTALS, totals_inputs())
    merged = sorted(run.outputs.records, key=lambda r: (r.source[1], r.source[0]))
    run = with_outputs(run, [replace(r, partition=0, offset=i) for i, r in enumerate(merged)])

    assert check(TOTALS, run).ok


def test_a_wrong_value_is_a_content_problem():
    run = correct_run(TOTALS, totals_inputs())
    records = list(run.outputs.records)
    records[2] = replace(records[2], value=b'{"id":2,"count":2,"sum":13}')

    verdict = check(TOTALS, with_outputs(run, records))

    assert problem_counts(verdict) == {"content": 1}
    assert first_where(verdict, "content") == "0:2"
    assert 'sum":13' in verdict.content.samples[0].detail


def test_an_output_without_source_header_is_a_content_problem():
    run = correct_run(TOTALS, totals_inputs())
    records = [*run.outputs.records, KafkaRecord(0, 77, b"a", b"{}")]

    verdict = check(TOTALS, with_outputs(run, records))

    assert problem_counts(verdict) == {"content": 1}
    assert first_where(verdict, "content") == "out 0@77"


def test_an_output_naming_no_input_record_is_a_content_problem():
    run = correct_run(TOTALS, totals_inputs())
    stray = KafkaRecord(0, 77, b"a", b"{}", ((SOURCE_HEADER, encode_source(0, 40)),))

    verdict = check(TOTALS, with_outputs(run, [*run.outputs.records, stray]))

    assert problem_counts(verdict) == {"content": 1}
    assert first_where(verdict, "content") == "0:40"


def test_an_explicit_output_partition_is_checked():
    inputs = [KafkaRecord(p, o, b"k", b"v%d" % o) for p in (0, 1) for o in range(3)]
    run = correct_run(copier.app, inputs)
    records = [replace(r, partition=1, offset=10) if r.source == (0, 1) else r for r in run.outputs.records]

    verdict = check(copier.app, with_outputs(run, records))

    assert problem_counts(verdict) == {"content": 1}
    assert "partition 1 != reference 0" in verdict.content.samples[0].detail


def test_a_dead_letter_with_other_bytes_than_the_input_is_a_content_problem():
    run = correct_run(TOTALS, totals_inputs())
    letters = [replace(run.dead_letters.records[0], value=b"garbled"), *run.dead_letters.records[1:]]

    verdict = check(TOTALS, replace(run, dead_letters=replace(run.dead_letters, records=letters)))

    assert problem_counts(verdict) == {"content": 1}


def test_a_wrong_state_in_the_changelog_is_a_state_problem():
    run = correct_run(TOTALS, totals_inputs())
    assert run.changelog is not None
    wrong = KafkaRecord(1, 50, b"c", b"[2,8]")
    run = replace(run, changelog=replace(run.changelog, records=[*run.changelog.records, wrong]))

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"state": 1}
    assert first_where(verdict, "state") == "state p1 'c'"


def test_changelog_last_write_wins_and_tombstones_delete():
    run = correct_run(TOTALS, totals_inputs())
    assert run.changelog is not None
    earlier = [
        KafkaRecord(0, 0, b"a", b"[9,9]"),
        KafkaRecord(0, 1, b"gone", b"[1,1]"),
        KafkaRecord(0, 2, b"gone", None),
    ]
    later = [replace(r, offset=r.offset + 3) for r in run.changelog.records]
    run = replace(run, changelog=replace(run.changelog, records=[*earlier, *later]))

    assert check(TOTALS, run).ok


def test_a_missing_state_key_is_a_state_problem():
    run = correct_run(TOTALS, totals_inputs())
    assert run.changelog is not None
    records = [r for r in run.changelog.records if r.key != b"d"]

    verdict = check(TOTALS, replace(run, changelog=replace(run.changelog, records=records)))

    assert problem_counts(verdict) == {"state": 1}


# -- offsets -------------------------------------------------------------------------------------------------------
def test_a_committed_offset_one_short_is_an_offsets_problem():
    run = correct_run(TOTALS, totals_inputs())
    verdict = check(TOTALS, replace(run, committed={0: 4, 1: 4}))

    assert problem_counts(verdict) == {"offsets": 1}
    assert first_where(verdict, "offsets") == "committed p0"
    assert verdict.offsets.samples[0].detail == "4, expected 5"


def test_no_committed_offset_is_an_offsets_problem():
    run = correct_run(TOTALS, totals_inputs())
    verdict = check(TOTALS, replace(run, committed={0: 5}))

    assert problem_counts(verdict) == {"offsets": 1}
    assert verdict.offsets.samples[0].detail.startswith("nothing")


def test_committed_past_trailing_markers_is_ok_but_not_beyond_the_end():
    run = correct_run(TOTALS, totals_inputs())
    run = replace(run, inputs=replace(run.inputs, ends={0: 7, 1: 4}))  # two markers after 0:4

    assert check(TOTALS, replace(run, committed={0: 7, 1: 4})).ok is False  # the checkpoint still says 5...
    assert check(TOTALS, replace(run, committed={0: 5, 1: 4})).ok  # ...and 5 is fine too
    assert problem_counts(check(TOTALS, replace(run, committed={0: 8, 1: 4}))) == {"offsets": 1}


def test_a_checkpoint_disagreeing_with_the_input_is_an_offsets_problem():
    run = correct_run(TOTALS, totals_inputs())
    assert run.changelog is not None
    stale = KafkaRecord(1, 60, CHECKPOINT_KEY, Checkpoint(IN, 1, 3).encode(), (CHECKPOINT_HEADER,))
    run = replace(run, changelog=replace(run.changelog, records=[*run.changelog.records, stale]))

    verdict = check(TOTALS, run)

    assert problem_counts(verdict) == {"offsets": 1}
    assert first_where(verdict, "offsets") == "checkpoint p1"


def test_an_empty_input_partition_needs_no_commit():
    inputs = [deposit(0, 0, "a", 1)]
    run = correct_run(TOTALS, inputs, partitions=(0,))
    run = replace(run, inputs=replace(run.inputs, ends={0: 1, 1: 0}))
    run = replace(run, changelog=replace(run.changelog, ends={0: 2, 1: 0}))

    assert check(TOTALS, run).ok


def test_a_stateless_app_has_no_state_or_checkpoint_checks():
    inputs = [KafkaRecord(0, o, b"k", b"v") for o in range(3)]
    run = correct_run(copier.app, inputs, partitions=(0,))

    verdict = check(copier.app, run)

    assert verdict.ok
    assert "stateless app: state and checkpoints not checked" in verdict.notes


# -- verdict and observer ------------------------------------------------------------------------------------------
def test_findings_keep_a_bounded_sample_and_the_full_count():
    found = Findings()
    for i in range(SAMPLE_LIMIT + 5):
        found.add(f"0:{i}", "x")
    assert found.count == SAMPLE_LIMIT + 5
    assert len(found.samples) == SAMPLE_LIMIT


def test_verdict_json_and_summary():
    run = correct_run(TOTALS, totals_inputs())
    verdict = check(TOTALS, with_outputs(run, run.outputs.records[1:]))

    parsed = json.loads(verdict.to_json())

    assert parsed["ok"] is False
    assert parsed["counts"] == {"inputs": 9, "outputs": 6, "dead_letters": 2, "changelog_records": 6}
    assert parsed["problems"]["losses"]["count"] == 1
    assert parsed["problems"]["losses"]["samples"][0]["where"] == "0:0"
    assert verdict.summary().startswith("exactly-once: FAILED")
    assert "losses" in verdict.summary()
    assert check(TOTALS, run).summary().startswith("exactly-once: OK")


def test_observer_records_absent_from_the_final_drain_are_reported():
    run = correct_run(TOTALS, totals_inputs())
    verdict = check(TOTALS, run)
    ghost = KafkaRecord(0, 99, b"a", b"{}", ((SOURCE_HEADER, b"0:0"),))
    changed = replace(run.outputs.records[0], value=b"other")

    assert observer_subset_of_final(run.outputs.records[:3], verdict) == []
    assert observer_subset_of_final([*run.outputs.records, ghost, changed], verdict) == [ghost, changed]
    assert observer_subset_of_final([ghost], run.outputs.records) == [ghost]


# -- loading and generators ----------------------------------------------------------------------------------------
def test_load_app_by_import_path():
    assert load_app("pipeline.examples.running_totals:app") is TOTALS
    with pytest.raises(ValueError, match="MODULE:ATTR"):
        load_app("pipeline.examples.running_totals")
    with pytest.raises(ValueError, match="no attribute"):
        load_app("pipeline.examples.running_totals:nope")
    with pytest.raises(TypeError, match=r"not a pipeline\.app\.App"):
        load_app("pipeline.examples.running_totals:process")


def test_running_totals_records_are_deterministic_keyed_and_poisoned_alternately():
    records = list(running_totals_records(12, partitions=3, accounts=4, seed=7, poison_every=4))

    assert records == list(running_totals_records(12, partitions=3, accounts=4, seed=7, poison_every=4))
    partition_of = {}
    for partition, key, _ in records:
        assert partition_of.setdefault(key, partition) == partition
    assert [i for i, (_, _, value) in enumerate(records) if not _is_json(value)] == [3, 11]
    assert orjson.loads(records[7][2]) == {"id": 7, "amount": "not-a-number"}
    assert isinstance(orjson.loads(records[0][2])["amount"], int)


def test_running_totals_value_size_pads_values():
    records = list(running_totals_records(3, partitions=1, value_size=200))
    assert all(195 <= len(value) <= 200 for _, _, value in records)
    assert orjson.loads(records[0][2])["id"] == 0


def test_copier_records_are_round_robin_with_sized_values():
    records = list(copier_records(5, partitions=2, value_size=10, seed=1))
    assert [p for p, _, _ in records] == [0, 1, 0, 1, 0]
    assert all(len(v) == 10 for _, _, v in records)
    assert records == list(copier_records(5, partitions=2, value_size=10, seed=1))


def _is_json(value: bytes) -> bool:
    try:
        orjson.loads(value)
        return True
    except orjson.JSONDecodeError:
        return False
