"""A restore's set-up never waits on a broker on the poll loop's thread (docs/guarantees.md:
restore-keeps-membership): on the 3-node cluster, the broker leading changelog p0 is paused (SIGSTOP); p0's restore
waits for its offsets, p1's restore goes on and finishes meanwhile, and the loop turns every step. p0 finishes
once the broker is back (its leader epoch moved: the admin client relearns the leaders).

The loop is the runner's, reduced to what a restore does to it: one poll of a consumer (BUSY_WAIT_S), then
RestoreManager.step, with restores started inside a turn as the assignment callback starts them. The gap between
two turns is measured at every turn: the synchronous set-up held one turn for REQUEST_TIMEOUT_MS (5 s here) per ask
of an unreachable leader."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.core.loop import BUSY_WAIT_S
from pipeline.kafka.clients import client_config, restore_consumer_config
from pipeline.serde import JSON
from pipeline.settings import Settings
from pipeline.state.restore import ChangelogRestore, RestorePhase
from pipeline.state.restore_manager import RestoreManager

pytestmark = pytest.mark.cluster
log = logging.getLogger(__name__)
PAUSED = 3  # the node that leads changelog p0 (and nothing else of this test)
# One turn of the loop while restoring: the poll (10 ms) and RESTORE_STEP_MS (200 ms), with room for a loaded machine.
ONE_TURN_S = 1.0
P1_RECORDS = 100_000


class Loop:
    """Turns like the runner's loop and notes the gap before every turn."""

    def __init__(self, consumer: Consumer, restores: RestoreManager) -> None:
        self.consumer, self.restores = consumer, restores
        self.gaps: list[float] = []
        self.finished: dict[int, ChangelogRestore] = {}
        self.progress: dict[int, list[object]] = {0: [], 1: []}
        self._last = time.monotonic()

    def turn(self, also: Callable[[], None] = lambda: None) -> None:
        now = time.monotonic()
        self.gaps.append(now - self._last)
        self._last = now
        self.consumer.poll(BUSY_WAIT_S)
        also()  # what the assignment callback does inside poll: start restores
        for restore in self.restores.step():
            self.finished[restore.partition] = restore
        for p, seen in self.progress.items():
            if p not in self.finished and (not seen or seen[-1] != self.restores.progress(p)):
                seen.append(self.restores.progress(p))

    def turn_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"not done in {timeout_s} s: {self.restores.stuck(0)}"
            self.turn()


def test_a_restore_goes_on_while_the_leader_of_another_partitions_changelog_is_unreachable(kafka_cluster) -> None:
    bootstrap, run = kafka_cluster.bootstrap, f"restore-fault-{uuid.uuid4().hex[:8]}"
    changelog, snapshots, loop_input = f"{run}-changelog", f"{run}-snapshots", f"{run}-input"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    one_replica = {"min.insync.replicas": "1"}
    topics = [  # p0 of the restore's topics on the node to pause, alone; everything else on the others
        NewTopic(changelog, 2, replica_assignment=[[PAUSED], [1]], config=one_replica),
        NewTopic(snapshots, 2, replica_assignment=[[PAUSED], [1]], config=one_replica),
        NewTopic(loop_input, 1, replica_assignment=[[1, 2]], config=one_replica),
    ]
    for future in admin.create_topics(topics, request_timeout=30).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    for p, n in ((0, 500), (1, P1_RECORDS)):
        for i in range(n):
            producer.produce(changelog, key=f"k{p}-{i % 5_000}", value=b'{"n": %d}' % i, partition=p)
            if i % 10_000 == 0:
                producer.poll(0)
    assert producer.flush(60) == 0

    settings = Settings(
        bootstrap_servers=bootstrap, request_timeout_ms=5_000, restore_step_ms=200, restore_timeout_ms=120_000
    )
    make_admin = lambda: AdminClient(client_config(settings))  # noqa: E731
    restores = RestoreManager(
        settings,
        changelog,
        snapshots,
        JSON,
        lambda: Consumer(restore_consumer_config(settings, f"{run}.restore")),
        make_admin,
        make_admin(),
    )
    polled = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{run}.loop", "enable.auto.commit": False})
    polled.assign([TopicPartition(loop_input, 0, 0)])
    loop = Loop(polled, restores)
    for _ in range(20):  # the loop's clients connected, as a running process's are
        loop.turn()

    kafka_cluster.pause(PAUSED)
    try:
        paused_at = time.monotonic()
        loop.turn(lambda: (restores.start(0, None), restores.start(1, None)))
        loop.turn_until(lambda: 1 in loop.finished, 60)
        p1_done_s = time.monotonic() - paused_at
        while time.monotonic() - paused_at < 12:  # past the broker's session time-out: its partitions lose their leader
            loop.turn()
        waiting = restores.running().get(0)
        stuck = restores.stuck(0)
    finally:
        kafka_cluster.resume(PAUSED)
    longest_paused = sorted(loop.gaps[20:], reverse=True)[:3]
    assert longest_paused[0] < ONE_TURN_S, f"turns of the loop waited {longest_paused} s on the paused broker"
    assert waiting is not None and waiting.phase is RestorePhase.OFFSETS, stuck
    resumed_at = time.monotonic()
    loop.turn_until(lambda: 0 in loop.finished, 90)
    p0_after_resume_s = time.monotonic() - resumed_at
    polled.close()
    for restore in loop.finished.values():
        restore.close()

    log.info(
        "p1 restored in %.2f s (%d steps that moved) while node %d was paused; longest turn gap then %.3f s "
        "over %d turns; p0 done %.2f s after the resume; p0 waited with: %s",
        p1_done_s,
        len(loop.progress[1]),
        PAUSED,
        longest_paused[0],
        len(loop.gaps) - 20,
        p0_after_resume_s,
        stuck,
    )
    assert loop.finished[1].records == P1_RECORDS and len(loop.finished[1].state) == 5_000
    assert len(loop.progress[1]) > 2, "p1's restore moved over several turns"
    assert loop.finished[0].records == 500 and len(loop.finished[0].state) == 500
    assert "p0's restore: offsets of" in stuck, stuck
