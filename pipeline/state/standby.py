"""Warm standbys (STANDBY_REPLICAS, as Kafka Streams' num.standby.replicas): copies of partitions other members own,
kept warm by following their changelog, so that taking one over reads only what its copy is behind
(docs/guarantees.md: standby-copies).

    place     which partitions this process keeps copies of, from the group's assignment (asked in the background
              every PLACE_EVERY_S): the members in the order of their names (static id, else member id), and each
              member's partitions copied by the next k members after it (k = STANDBY_REPLICAS, at most members - 1)
    warm up   a new copy is restored as an owner restores it (latest full snapshot + changelog since), without the
              check against the group's committed offset (the owner moves on meanwhile), in steps between polls
    follow    one read_committed consumer reads every warm copy's changelog partition on from where the copy stands
    promote   when the group gives p to this process, p's copy goes to p's restore (`take`), which reads the changelog
              on from the copy's position to the high watermark captured after the fence, and checks the checkpoint
              against the committed offset like any restore
    drop      a copy no longer placed here, or one whose records were deleted under it, is dropped (and warmed up
              again while it is still placed here)

STATE_STORE=disk: a copy lives in p's RocksDB store (pipeline/state/local_stores.py), warmed up from what that store
holds (as a restart: only the changelog after its recorded offset), and each followed batch is written with the offset
it reaches in one atomic batch (StandbyCopy.follow): the store is a copy as of its offset whenever the process dies,
and a promotion hands that store to p's restore.

A copy holds only committed changelog, read in order: a promotion gives the restore the same state it would have
built itself, only read earlier. With more than two members the group's assignor, not this placement, picks who
takes a partition over: the taker has a copy when it is one of the k after the owner (always with k = members - 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline.kafka.kafka_python import GroupAnswer
from pipeline.kafka.offsets import EndOffsetsTimeout, OffsetsTruncated
from pipeline.kafka.records import Consumed
from pipeline.state.changelog_apply import changelog_entries
from pipeline.state.disk_store import StoreFull
from pipeline.state.restore import ChangelogRestore, RestoreError, StandbyCopy

log = logging.getLogger(__name__)
Describe = Callable[[], GroupAnswer]  # the group's members and their input partitions: GroupAdmin.describe
PLACE_EVERY_S = 2.0  # how often the group's assignment is asked for (a rebalance moves copies within this)
FOLLOW_BATCH = 10_000  # changelog records read per consume
# Copies warming up at once: each holds two consumers while it runs, and at start-up every copy is placed at once
# (at 384 partitions, 192 of them).
MAX_WARMING = 8
_TRUNCATED = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})


def standby_partitions(owners: Mapping[str, Collection[int]], me: str, replicas: int) -> set[int]:
    """The partitions `me` keeps copies of: those of the `replicas` members before it, in the order of their names
    (a ring), never its own."""
    names = sorted(owners)
    if me not in names or replicas <= 0:
        return set()
    n, mine, k = len(names), names.index(me), min(replicas, len(names) - 1)
    copies: set[int] = set()
    for i, name in enumerate(names):
        if 0 < (mine - i) % n <= k:
            copies.update(owners[name])
    return copies - set(owners[me])


class Standbys:
    """Every standby copy of one runner: placed, warmed up and followed in `step` (between polls, within a budget),
    handed to a restore by `take` when its partition is assigned here."""

    def __init__(
        self,
        replicas: int,
        changelog_topic: str,
        warm_up: Callable[[int], ChangelogRestore],
        make_consumer: Callable[[], Consumer],
        describe: Describe,
        member_id: Callable[[], str],
        on_count: Callable[[int], None] = lambda copies: None,
    ) -> None:
        self.replicas, self._topic = replicas, changelog_topic
        self._warm_up, self._make_consumer, self._describe, self._member_id = (
            warm_up,
            make_consumer,
            describe,
            member_id,
        )
        # The group's assignment is asked for on a thread of this pool: `describe` blocks (TakeOver._group_describer
        # says which client asks, and why not librdkafka's under the classic protocol).
        self._asking = ThreadPoolExecutor(1, thread_name_prefix="standby-placement")
        self._on_count = on_count  # told the number of warm copies whenever it changes (the gauge)
        self.copies: dict[int, StandbyCopy] = {}  # warm, followed
        self.warming: dict[int, ChangelogRestore] = {}
        self.wanted: set[int] = set()  # placed here by the last answer
        self._owned_by_members: set[int] = set()  # owned by some member, per the last answer
        self._asked: Future[Any] | None = None
        self._next_ask = 0.0
        self._follower: Consumer | None = None

    @property
    def busy(self) -> bool:
        """A copy is warming up: the poll loop turns fast meanwhile, as during a restore."""
        return bool(self.warming)

    def step(self, owned: Collection[int], budget_s: float) -> None:
        """Placement (when an answer came), then the warm-ups, then the followed changelog, within about budget_s."""
        until = time.monotonic() + budget_s
        self._place(owned)
        for p, restore in list(self.warming.items()):
            self._step_warm_up(p, restore, max(0.001, (until - time.monotonic()) / max(1, len(self.warming))))
        if self.copies:
            self._follow(until)

    def take(self, p: int) -> StandbyCopy | None:
        """p is assigned here: its warm copy (None if there is none), no longer followed."""
        self.wanted.discard(p)
        copy = self.copies.get(p)
        self._drop(p)
        if copy is not None:
            log.info("p%d: promoting the standby copy (%d keys, at %d)", p, len(copy.state), copy.position)
        return copy

    def close(self) -> None:
        for p in list(self.copies) + list(self.warming):
            self._drop(p)
        if self._follower is not None:
            self._follower.close()
            self._follower = None
        self._asking.shutdown(wait=False)

    # -- placement ---------------------------------------------------------------------------------------------------
    def _place(self, owned: Collection[int]) -> None:
        now = time.monotonic()
        if self._asked is not None and self._asked.done():
            asked, self._asked = self._asked, None
            try:
                self.wanted, self._owned_by_members = self._placed_here(asked.result())
            except Exception as e:  # the coordinator moving, most often: ask again next time, never stop the loop
                log.warning("standby placement: the group's assignment not readable (%s); asking again", e)
        if self._asked is None and now >= self._next_ask:
            self._next_ask = now + PLACE_EVERY_S
            self._asked = self._asking.submit(self._describe)
        for p in [p for p in (*self.copies, *self.warming) if self._placed_elsewhere(p, owned)]:
            log.info("p%d: standby copy dropped (no longer placed here)", p)
            self._drop(p)
        for p in sorted(self.wanted - set(owned) - self.copies.keys() - self.warming.keys()):
            if len(self.warming) >= MAX_WARMING:
                break
            self._start_warm_up(p)

    def _placed_elsewhere(self, p: int, owned: Collection[int]) -> bool:
        """p is ours now, or another member owns it and its copies belong to others. A partition nobody owns (its
        owner just died, the group is rebalancing) keeps its copy: that is when the copy is needed."""
        return p in owned or (p in self._owned_by_members and p not in self.wanted)

    def _placed_here(self, answer: GroupAnswer) -> tuple[set[int], set[int]]:
        """(the partitions placed here, every partition some member owns) per the group's answer."""
        me, owners = "", {}
        for member in answer[1]:
            owners[member.name] = sorted(member.partitions)
            if member.member_id == self._member_id():
                me = member.name
        owned = {p for partitions in owners.values() for p in partitions}
        return standby_partitions(owners, me, self.replicas), owned

    # -- warm-up and follow ------------------------------------------------------------------------------------------
    def _start_warm_up(self, p: int) -> None:
        try:
            self.warming[p] = self._warm_up(p)
            log.info("p%d: warming up a standby copy", p)
        except (EndOffsetsTimeout, KafkaException) as e:
            log.info("p%d: standby copy not started (%s); trying again at the next placement", p, e)

    def _step_warm_up(self, p: int, restore: ChangelogRestore, budget_s: float) -> None:
        try:
            done = restore.step(budget_s)
        except (RestoreError, EndOffsetsTimeout, OffsetsTruncated, KafkaException) as e:
            log.warning("p%d: standby copy failed to warm up (%s); trying again at the next placement", p, e)
            self._drop(p)
            return
        except StoreFull as e:
            self._disk_refused(p, e)
            return
        if not done:
            return
        del self.warming[p]
        restore.close()
        self.copies[p] = StandbyCopy(p, restore.state, restore.end, restore.snapshot, restore.last_checkpoint)
        self._on_count(len(self.copies))
        log.info("p%d: standby copy warm (%d keys, changelog offset %d)", p, len(restore.state), restore.end)
        self._follower_consumer().incremental_assign([TopicPartition(self._topic, p, restore.end)])

    def _follow(self, until: float) -> None:
        follower = self._follower_consumer()
        while True:
            messages = follower.consume(FOLLOW_BATCH, 0)
            if not messages:
                return
            self._apply(messages)
            if len(messages) < FOLLOW_BATCH or time.monotonic() >= until:
                return

    def _apply(self, messages: list[Message]) -> None:
        by_partition: dict[int, list[Consumed]] = {}
        for m in messages:
            p = m.partition()
            if (error := m.error()) is not None:
                if error.code() in _TRUNCATED and p in self.copies:  # deleted under the copy: warmed up again
                    log.warning("p%d: standby copy dropped: %s", p, error)
                    self._drop(p)
                continue
            record = cast(Consumed, m)  # no error: a record, with its partition and offset
            copy = self.copies.get(record.partition())
            if copy is not None and record.offset() >= copy.position:  # not one fetched before a drop and re-warm
                by_partition.setdefault(copy.partition, []).append(record)
        for p, batch in by_partition.items():
            changes, checkpoint = changelog_entries(batch)
            try:
                self.copies[p].follow(changes, batch[-1].offset() + 1, checkpoint)
            except StoreFull as e:
                self._disk_refused(p, e)

    def _disk_refused(self, p: int, error: StoreFull) -> None:
        """STATE_STORE=disk: the copy's store refused a batch (disk full). The copy goes (its store keeps the last
        batch it took, whose offset it records); p's owner is not affected, and a promotion restores from what the
        store holds. Warmed up again at the next placement: the ERROR repeats until the disk has room."""
        log.error("p%d: standby copy dropped: %s. %s", p, error, StoreFull.fix)
        self._drop(p)

    def _follower_consumer(self) -> Consumer:
        if self._follower is None:
            self._follower = self._make_consumer()
        return self._follower

    def _drop(self, p: int) -> None:
        if (restore := self.warming.pop(p, None)) is not None:
            restore.close()
        if self.copies.pop(p, None) is not None:
            self._on_count(len(self.copies))
            if self._follower is not None:
                self._follower.incremental_unassign([TopicPartition(self._topic, p)])
