"""Input partitions that no member of the group owns (docs/guarantees.md: no-silent-stall).

The stall watchdog watches the partitions a process owns; a partition nobody owns has no one to say it waits. A CI
run found how one gets there. Under the classic protocol, cooperative rebalancing moves a partition in two rounds:
the first takes it from its owner, which then asks for a second round that gives it to its new owner. A static
member killed between the two rounds (just after a peer joined) and restarted at once under its GROUP_INSTANCE_ID
takes its place back without a rebalance, as static membership promises. Nobody asks for the second round, and the
partition stays unassigned for as long as the group does not change: 30 s in that run, for ever in a quiet one.

So every process asks the broker, every LOOK_EVERY_S, for the group's assignment and the input's partition count, from
a thread of its own through kafka-python (pipeline/kafka/kafka_python.py: GroupAdmin says why not librdkafka's admin
client; the loop only hands over its member id). A partition that nobody owns in a stable group for
longer than SESSION_TIMEOUT_MS (what the group grants a silent member) gets a WARNING and the gauge
pipeline_unowned_partitions. The member owning the fewest partitions (ties: the smallest name; every process elects
the same member from the same answer) then has itself removed from the group (KIP-345's removal, which the failure
detector uses for silent peers): the rebalance that follows assigns the partition, at the cost of the fewest
partitions any member could give up for one rebalance. Under GROUP_PROTOCOL=consumer (KIP-848) the broker assigns
and reconciles on its own, and there is no second round to miss: no look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import Gauge

from pipeline.kafka.kafka_python import GroupAnswer, GroupMember

log = logging.getLogger(__name__)
LOOK_EVERY_S = 2.0


class Admin(Protocol):
    """What the look asks of the group's admin client (pipeline/kafka/kafka_python.py: GroupAdmin)."""

    def describe(self, topic: str) -> GroupAnswer: ...

    def remove(self, member_id: str, instance_id: str) -> str: ...

    def close(self) -> None: ...


class GroupCoverage:
    """The look, every LOOK_EVERY_S on a thread of its own: `judge` decides from each answer."""

    def __init__(
        self,
        group: str,
        topic: str,
        bound_s: float,
        gauge: Gauge,
        admin: Admin,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group, self._topic, self.bound_s, self._gauge = group, topic, bound_s, gauge
        self._admin, self._clock = admin, clock
        self.member_id = ""  # this process's, handed over by the poll loop ("" until it joined)
        self.unowned_since: dict[int, float] = {}  # p -> when a look first found it unowned in a stable group
        self._warned_at = self._removed_at = float("-inf")
        self.removals: list[str] = []  # the members this process had removed (itself), for tests
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-coverage", daemon=True)

    def start(self) -> GroupCoverage:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._admin.close()

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY_S):
            self.look()

    def look(self) -> None:
        """One look: the group's answer judged; no answer (the coordinator moving, a broker down) is logged once,
        until one comes again, and never stops anything."""
        try:
            state, members, partitions = self._admin.describe(self._topic)
        except Exception as e:
            if not self._failing:
                log.info("group coverage: the group's assignment not readable (%s); asked again every 2 s", e)
            self._failing = True
            return
        self._failing = False
        self.judge(state == "Stable", members, partitions, self.member_id, self._clock())

    def judge(self, stable: bool, members: list[GroupMember], partitions: int, me: str, now: float) -> None:
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
                f"Member {elected.name} (owning {len(elected.partitions)}) leaves the group to start a rebalance",
            )
        if elected.member_id == me and now - self._removed_at >= self.bound_s:
            self._removed_at = now
            self.removals.append(elected.name)
            self._remove_self(elected)

    def _remove_self(self, member: GroupMember) -> None:
        try:
            answer = self._admin.remove(member.member_id, member.instance_id)
            log.warning(
                "member %s removed itself from group %s to start a rebalance: %s", member.name, self._group, answer
            )
        except Exception as e:
            log.error("member %s could not remove itself from group %s: %s", member.name, self._group, e)
