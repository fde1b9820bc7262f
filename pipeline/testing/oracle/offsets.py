"""The offsets a run committed: the group's committed offset and the last changelog checkpoint of every input
partition must point just past its last record, and agree (docs/guarantees.md: complete-restore)."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from pipeline.state.changelog import Checkpoint, is_checkpoint
from pipeline.testing.oracle.inputs import topics_of
from pipeline.testing.oracle.records import KafkaRecord, RunData
from pipeline.testing.oracle.verdict import Findings


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
    must agree (docs/guarantees.md: complete-restore); that is reported only when both are plausible, so one wrong
    offset is one problem."""
    found = Findings()
    last_data: dict[int, int] = {}
    for record in run.inputs.records:
        last_data[record.partition] = max(record.offset, last_data.get(record.partition, -1))
    checkpoints = last_checkpoints(run.changelog.records, found) if run.changelog is not None else None
    for p in run.inputs.partitions:
        lowest, end = (last_data[p] + 1 if p in last_data else None), run.inputs.ends[p]
        committed = run.committed.get(p)
        committed_ok = check_next_offset(found, f"committed p{p}", committed, lowest, end)
        if checkpoints is None:
            continue
        checkpoint = checkpoints.get(p)
        next_offset = checkpoint.next_input_offset if checkpoint else None
        checkpoint_ok = check_next_offset(found, f"checkpoint p{p}", next_offset, lowest, end)
        if checkpoint_ok and committed_ok and next_offset != committed:
            found.add(f"checkpoint p{p}", f"{next_offset}, but the committed offset is {committed}")
        if checkpoint and (checkpoint.input_topic, checkpoint.input_partition) != (run.input_topic, p):
            found.add(f"checkpoint p{p}", f"names {checkpoint.input_topic}:{checkpoint.input_partition}")
    return found


def check_next_offset(found: Findings, where: str, actual: int | None, lowest: int | None, end: int) -> bool:
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


def check_offsets_several(run: RunData) -> Findings:
    """For every co-partitioned topic (inputs and tables) and partition: the committed offset points past its last
    record, and the last checkpoint names the same offset (docs/guarantees.md: complete-restore)."""
    found = Findings()
    checkpoints = last_checkpoints(run.changelog.records, found) if run.changelog is not None else None
    committed = {run.input_topic: run.committed, **run.more_committed}
    for topic, dump in zip(topics_of(run), [run.inputs, *run.more_inputs.values()], strict=True):
        last_data: dict[int, int] = {}
        for record in dump.records:
            last_data[record.partition] = max(record.offset, last_data.get(record.partition, -1))
        for p in dump.partitions:
            lowest, end = (last_data[p] + 1 if p in last_data else None), dump.ends[p]
            offset = committed.get(topic, {}).get(p)
            committed_ok = check_next_offset(found, f"committed {topic}[{p}]", offset, lowest, end)
            if checkpoints is None or p not in checkpoints:
                continue
            covered = checkpoints[p].covers().get(topic)
            checkpoint_ok = check_next_offset(found, f"checkpoint {topic}[{p}]", covered, lowest, end)
            if checkpoint_ok and committed_ok and covered != offset:
                found.add(f"checkpoint {topic}[{p}]", f"{covered}, but the committed offset is {offset}")
    return found
