"""What a restore refuses (docs/guarantees.md: complete-restore): a changelog that no longer reaches back to the
snapshot it needs, and a restored state whose checkpoint does not name the group's committed offset. Each refusal
says what is missing and how to repair it; pipeline/state/restore.py raises them."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pipeline.state.changelog import Checkpoint
from pipeline.state.snapshot_format import Manifest

log = logging.getLogger("pipeline.state.restore")  # the restore's own log lines


class RestoreError(RuntimeError):
    """p's state cannot be restored completely; the message says what is missing and how to repair it."""


def truncated(topic: str, p: int, low: int, manifest: Manifest | None, skipped: list[str]) -> RestoreError:
    """The changelog of p starts at `low`, above where the newest usable snapshot (or, without one, offset 0) ends."""
    unusable = f" Snapshots found unusable: {'; '.join(skipped)}." if skipped else ""
    if manifest is None:
        return RestoreError(
            f"{topic}[{p}] starts at offset {low}, not 0: changes were deleted (retention?) and there is no "
            f"usable full snapshot to start from.{unusable} Repair: publish a full snapshot that covers at least "
            f"changelog offset {low} (run `snapshots compact` while the changelog is complete), or restore the "
            "changelog's retention.ms=-1 and rebuild the state by reprocessing the input into a new app id."
        )
    return RestoreError(
        f"{topic}[{p}] starts at offset {low}, but the newest usable full snapshot {manifest.snapshot_id} "
        f"(generation {manifest.generation}) covers the changelog only below {manifest.changelog_offset}: the "
        f"changes in between were deleted.{unusable} Repair: keep the changelog's retention.ms=-1 (only the "
        "compaction job deletes from it, and only below the previous generation) and rebuild the state by "
        "reprocessing the input into a new app id; if a newer snapshot was damaged, recreate it from a backup."
    )


def verify_checkpoint(
    p: int,
    last_checkpoint: Checkpoint | None,
    snapshot: Manifest | None,
    committed: int | Mapping[str, int | None] | None,
    strict: bool,
) -> None:
    """The restored state must cover exactly the group's committed offset of p (of every input, for several):
    RestoreError if not (`strict`, exactly-once), a WARNING at-least-once (its checkpoint may run ahead)."""
    if last_checkpoint is not None:
        covered, source = _covered_by(last_checkpoint, committed), "the changelog's last checkpoint"
    elif snapshot is not None:
        if isinstance(committed, Mapping):
            covered = {topic: (snapshot.input_offsets or {}).get(topic) for topic in committed}
        else:
            covered = snapshot.input_offset
        source = f"the snapshot {snapshot.snapshot_id}"
    else:
        covered, source = None, "the changelog's last checkpoint"
    expected = dict(committed) if isinstance(committed, Mapping) else committed
    if isinstance(expected, dict) and covered is None:  # nothing committed yet: every input at its start
        covered = {topic: None for topic in expected}
    if covered != expected and not strict:
        log.warning(
            "p%d: checkpoint %s != committed offset %s: records in between are applied again (at-least-once)",
            p,
            covered,
            expected,
        )
    elif covered != expected:
        raise RestoreError(
            f"p{p}: {source} covers input offset {covered} but the group's "
            f"committed offset is {expected}. They are written in one transaction, so one of them "
            "was lost (expired group offsets? a deleted or wrong changelog topic?). Repair: reset the group's "
            f"offset of p{p} to {covered} if the changelog is right, or start a new app id."
        )


def _covered_by(
    checkpoint: Checkpoint, committed: int | Mapping[str, int | None] | None
) -> int | dict[str, int | None] | None:
    if isinstance(committed, Mapping):  # several inputs: every topic's offset
        return {topic: checkpoint.covers().get(topic) for topic in committed}
    return checkpoint.next_input_offset
