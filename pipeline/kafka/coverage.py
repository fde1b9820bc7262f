"""Input partitions that no member of the group owns (docs/guarantees.md: no-silent-stall).

The stall watchdog watches the partitions a process owns; a partition nobody owns has no one to say it waits. A CI
run found how one gets there. Under the classic protocol, cooperative rebalancing moves a partition in two rounds:
the first takes it from its owner, which then asks for a second round that gives it to its new owner. A static
member killed between the two rounds (just after a peer joined) and restarted at once under its GROUP_INSTANCE_ID
takes its place back without a rebalance, as static membership promises. Nobody asks for the second round, and the
partition stays unassigned for as long as the group does not change: 30 s in that run, for ever in a quiet one.

So every process asks the broker, every LOOK_EVERY_S, for the group's assignment and the input's partition count,
without waiting (the loop reads the answers at a later look). A partition that nobody owns in a stable group for
longer than SESSION_TIMEOUT_MS (what the group grants a silent member) gets a WARNING and the gauge
pipeline_unowned_partitions. The member owning the fewest partitions (ties: the smallest name; every process elects
the same member from the same answer) then has itself removed from the group (KIP-345's removal, which the failure
detector uses for silent peers): the rebalance that follows assigns the partition, at the cost of the fewest
partitions any member could give up for one rebalance. Under GROUP_PROTOCOL=consumer (KIP-848) the broker assigns
and reconciles on its own: the WARNING and the gauge stay, nobody is removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupState, TopicCollection
from confluent_kafka.admin import AdminClient
from prometheus_client import Gauge

log = logging.getLogger(__name__)
LOOK_EVERY_S = 2.0


@dataclass(frozen=True)
class Member:
    member_id: str
    instance_id: str  # "" for a dynamic member
    partitions: frozenset[int]  # of the input topic

    @property
    def name(self) -> str:
        return self.instance_id or self.member_id


# remove(member_id, instance_id) -> the broker's answer (pipeline/kafka/kafka_python.py: member_remover)
Remove = Callable[[str, str], str]


class GroupCoverage:
    def __init__(
        self,
        group: str,
        topic: str,
        bound_s: float,
        gauge: Gauge,
        remove: Remove | None,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group, self._topic, self.bound_s, self._gauge = group, topic, bound_s, gauge
        self._remove, self._timeout_s, self._clock = remove, timeout_s, clock
        self._asked_at = float("-inf")
        self._pending: tuple[Future[Any], Future[Any]] | None = None
        self.unowned_since: dict[int, float] = {}  # p -> when a look first found it unowned in a stable group
        self._warned_at = self._removed_at = float("-inf")
        self.removals: list[str] = []  # the members this process had removed (itself), for tests

    def look(self, admin: AdminClient, member_id: str) -> None:
        """Once a second, from the loop: takes in an answer that is done, asks again when one is due."""
        now = self._clock()
        if self._pending is not None and all(f.done() for f in self._pending):
            group, topic = self._pending
            self._pending = None
            try:
                description = group.result()
                stable = description.state is ConsumerGroupState.STABLE
                self.judge(stable, _members(description, self._topic), len(topic.result().partitions), member_id, now)
            except Exception as e:  # the coordinator moving, most often: asked again at the next look
                log.debug("group coverage: no answer (%s)", e)
        if self._pending is None and now - self._asked_at >= LOOK_EVERY_S:
            self._asked_at = now
            try:
                group = admin.describe_consumer_groups([self._group], request_timeout=self._timeout_s)[self._group]
                topics = admin.describe_topics(TopicCollection([self._topic]), request_timeout=self._timeout_s)
                self._pending = (group, topics[self._topic])
            except Exception as e:  # never stops the loop
                log.debug("group coverage: could not ask (%s)", e)

    def judge(self, stable: bool, members: list[Member], partitions: int, me: str, now: float) -> None:
        """One answer: which partitions nobody owns, since when; a WARNING, and the removal if this process is the
        one elected to make way."""
        if not stable or not members:  # a rebalance under way assigns them; an empty group has no one to
            self.unowned_since.clear()
            self._gauge.set(0)
            return
        owned = frozenset().union(*(m.partitions for m in members))
        self.unowned_since = {p: self.unowned_since.get(p, now) for p in range(partitions) if p not in owned}
        long_unowned = sorted(p for p, since in self.unowned_since.items() if now - since >= self.bound_s)
        self._gauge.set(len(long_unowned))
        if not long_unowned:
            return
        elected = min(members, key=lambda m: (len(m.partitions), m.name))
        if now - self._warned_at >= self.bound_s:
            self._warned_at = now
            log.warning(
                "%s[%s]: no member of group %s owns them, for over %.0f s, in a stable group (a cooperative "
                "rebalance's second round that never came: its member restarted in between). %s",
                self._topic,
                ",".join(map(str, long_unowned)),
                self._group,
                now - min(self.unowned_since[p] for p in long_unowned),
                f"Member {elected.name} (owning {len(elected.partitions)}) leaves the group to start a rebalance"
                if self._remove is not None
                else "The broker assigns them (GROUP_PROTOCOL=consumer); if this lasts, restart one member",
            )
        if self._remove is not None and elected.member_id == me and now - self._removed_at >= self.bound_s:
            self._removed_at = now
            self.removals.append(elected.name)
            remove = self._remove
            threading.Thread(target=_removed, args=(remove, self._group, elected), name="coverage", daemon=True).start()


def _members(description: Any, topic: str) -> list[Member]:
    return [
        Member(
            m.member_id,
            m.group_instance_id or "",
            frozenset(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic),
        )
        for m in description.members
    ]


def _removed(remove: Remove, group: str, member: Member) -> None:
    """On a thread of its own: the removal is a broker call, and the loop never waits for one."""
    try:
        answer = remove(member.member_id, member.instance_id)
        log.warning("member %s removed itself from group %s to start a rebalance: %s", member.name, group, answer)
    except Exception as e:
        log.error("member %s could not remove itself from group %s: %s", member.name, group, e)
