"""Applying changelog records to a partition's state, in the changelog's order: the one fold that restores and
standby copies share (pipeline/state/restore.py, pipeline/state/standby.py). Kept apart from changelog.py, the record
format, which the checker reads without any Kafka client."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from confluent_kafka import Message

from pipeline.kafka.records import Consumed
from pipeline.state.changelog import CHECKPOINT_KEY, Checkpoint, is_checkpoint
from pipeline.state.store import PartitionState

CHECKPOINT_KEY_STR = CHECKPOINT_KEY.decode()
# Message's own C methods, typed for a changelog record (which always has a key): mapped over a batch, no Python loop.
_key = cast(Callable[[Consumed], bytes], Message.key)
_value = cast(Callable[[Consumed], bytes | None], Message.value)


def _positions(items: list[bytes], value: bytes) -> list[int]:
    """Indexes of `value` in `items`, found by list.index (C) rather than a Python loop over every item."""
    found, i = [], -1
    for _ in range(items.count(value)):
        i = items.index(value, i + 1)
        found.append(i)
    return found


def apply_changelog(state: PartitionState, messages: list[Consumed]) -> Checkpoint | None:
    """Applies changelog records of one partition to `state` in order; the last checkpoint among them, if any. Restores
    and standby copies (pipeline/state/standby.py) fold the changelog the same way."""
    entries, last = changelog_entries(messages)
    state.load(entries)
    return last


def changelog_entries(messages: list[Consumed]) -> tuple[dict[str, bytes | None], Checkpoint | None]:
    """The state's changes that changelog records of one partition make, in order (last write per key wins; None: a
    deletion), and the last checkpoint among them, if any."""
    keys = list(map(_key, messages))
    marks = _positions(keys, CHECKPOINT_KEY)
    last: Checkpoint | None = None
    if all(is_checkpoint(CHECKPOINT_KEY, messages[i].headers()) for i in marks):
        # The usual batch: C-level loops only. Last write per key wins, as in the changelog's order.
        batch = dict(zip(map(bytes.decode, keys), map(_value, messages), strict=True))
        if marks:
            del batch[CHECKPOINT_KEY_STR]
            last = Checkpoint.decode(messages[marks[-1]].value())
        return batch, last
    entries: dict[str, bytes | None] = {}  # a state key spelled like the checkpoint key: sorted out record by record
    for m in messages:
        if is_checkpoint(m.key(), m.headers()):
            last = Checkpoint.decode(m.value())
        else:
            entries[_key(m).decode()] = m.value()
    return entries, last
