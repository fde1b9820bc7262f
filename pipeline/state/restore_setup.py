"""What a restore of p asks before it reads anything (pipeline/state/restore.py: phase `offsets`), without waiting on
the poll loop's thread (docs/guarantees.md: restore-keeps-membership).

ask_bounds     the changelog's low and high watermarks and the snapshot topic's bounds, as PendingOffsets: the
               restore looks for the answer each step. Asked synchronously they held the loop up to
               REQUEST_TIMEOUT_MS per ask when the leader of p's changelog had gone, and every partition with it.
warm_metadata  the restore consumer's metadata of its topics, on a thread of its own
StandbyCopy    what a promotion starts from instead of the snapshot (pipeline/state/standby.py)
AtStateVersion a copy's committed reads at the App's state version (interactive queries, ?allow_standby=1)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.app import App
from pipeline.kafka.offsets import OffsetRequest, PendingOffsets, ask_offsets, relearn_leaders
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint
from pipeline.state.disk_store import DiskBacked, StoredVersions
from pipeline.state.snapshot_finder import snapshot_bounds_request
from pipeline.state.snapshot_format import Manifest

log = logging.getLogger(__name__)
METADATA_WARM_UP_S = 5.0  # the longest a restore consumer's metadata warm-up keeps its thread (and the close) waiting


@dataclass
class StandbyCopy:
    """p's state as of changelog offset `position` (every record below it applied), with the full snapshot it was
    warmed up from and the last checkpoint it read: what a restore of p would hold at that offset."""

    partition: int
    state: PartitionState
    position: int
    snapshot: Manifest | None
    last_checkpoint: Checkpoint | None

    def follow(self, changes: Mapping[str, bytes | None], position: int, checkpoint: Checkpoint | None) -> None:
        """Changelog records below `position` applied (`changes`, their last checkpoint if any). A copy on disk
        (STATE_STORE=disk) takes them with `position` and the checkpoint in one atomic batch, so that what its store
        records is true whenever the process dies: a restart or a promotion reads only the changelog after it."""
        if isinstance(self.state, DiskBacked):
            self.state.load_at(changes, position, checkpoint)
        else:
            self.state.load(changes)
        self.position = position
        self.last_checkpoint = checkpoint or self.last_checkpoint


class AtStateVersion:
    """A standby copy's committed reads at the App's state version (above 1): a copy holds the changelog's values as
    they are, each tagged with the version that wrote it (pipeline/state/versions.py), where an owner's state (and a
    disk store's committed reads) give the current version's bytes; older values are migrated as a restore would,
    by the disk store's own StoredVersions."""

    def __init__(self, state: PartitionState, app: App) -> None:
        self.state = state
        self._versions = StoredVersions(app.state_version, app.state_serde, app.migrate)

    def committed_get(self, key: str) -> bytes | None:
        value = self.state.committed_get(key)
        return None if value is None else self._versions.current(key, value)

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        current = self._versions.current
        return [(key, current(key, value)) for key, value in self.state.committed_range(prefix, limit)]


def ask_bounds(
    admin: AdminClient, changelog_topic: str, snapshot_topic: str | None, partition: int, request_timeout_s: float
) -> PendingOffsets[str]:
    """Answers by key: changelog_low, end (the high watermark: read_uncommitted, see restore.py's `tail`), and with a
    snapshot topic snapshot_low and snapshot_end (snapshot_finder.snapshot_bounds_request)."""
    tp = TopicPartition(changelog_topic, partition)
    wanted = {"changelog_low": OffsetRequest(tp, OffsetSpec.earliest()), "end": OffsetRequest(tp, OffsetSpec.latest())}
    if snapshot_topic is not None:
        wanted.update(snapshot_bounds_request(snapshot_topic, partition))
    topics = list(dict.fromkeys(request.tp.topic for request in wanted.values()))
    return PendingOffsets(
        f"p{partition}'s restore: offsets of {' and '.join(topics)}",
        ask_offsets(admin, wanted, request_timeout_s),
        lambda: relearn_leaders(admin, topics, request_timeout_s),
        request_timeout_s,
    )


def warm_metadata(consumer: Consumer, topics: list[str]) -> Future[None]:
    """The consumer's metadata of the restore's topics, asked on a thread of its own (the poll loop's must not wait):
    a topic first met at assign() waits for librdkafka's next (backed-off) metadata refresh, up to a second, before
    its first fetch. Done (the future) when the answer came or the ask failed: close the consumer only then."""
    done: Future[None] = Future()

    def warm() -> None:
        try:
            for topic in topics:
                consumer.list_topics(topic, timeout=METADATA_WARM_UP_S)
        except Exception as e:  # best effort: the first fetch then waits for librdkafka's own refresh
            log.debug("restore consumer: metadata of %s not known yet: %s", topics, e)
        finally:
            done.set_result(None)

    threading.Thread(target=warm, name="restore-metadata", daemon=True).start()
    return done
