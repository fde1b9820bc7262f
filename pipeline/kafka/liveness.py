"""Fast failure detection (FAILURE_DETECTION_MS; docs/guarantees.md: fast-failure-detection; issue 22).

Without it, a member that dies without leaving the group (SIGKILL, a lost machine) holds its partitions until the
group's session time-out, and, under PRODUCERS=per_process, its open transaction holds their committed offsets and
changelog until TRANSACTION_TIMEOUT_MS. With it, every process of one App publishes a heartbeat every quarter of the
bound on the topic `<app_id>-liveness` (from a thread of its own, so a long batch or restore does not stop it) and
reads everyone's. When a peer it has heard from is silent for longer than the bound, while this process heard its
own heartbeats throughout (within half the bound: so the topic delivers, its own reading works and it was not paused
itself), it
    1. fences the peer's per-process producer (init_transactions on its transactional.id): its open transaction is
       aborted now instead of after TRANSACTION_TIMEOUT_MS;
    2. removes the peer's member from the group (LeaveGroup for that member, KIP-345's admin removal): the group
       rebalances now instead of after the session time-out.
Both are what the protocol already survives from any zombie: a peer that was only paused (a false positive) finds
its producer fenced (its partitions dropped, taken over again with a new producer) and its membership gone (its
partitions lost, then it rejoins). Nothing it had not committed becomes visible; exactly once holds. The cost of a
false positive is one rebalance and a restore. A process that stops cleanly says so in its last heartbeat and is not
removed (it left the group itself, or, as a static member, is expected back within the session time-out). Nor is
a static member whose new incarnation (restarted under the same GROUP_INSTANCE_ID, e.g. by the supervisor) is
beating: that one takes the old one's place in the group without a rebalance and aborts its transaction with its own
init_transactions; removing the old one would cost a rebalance there and another when the new one joins. Leaving a
member alone is always safe (the session and transaction time-outs still end it); only acting is a speed-up.

confluent-kafka's AdminClient (librdkafka 2.16) has no "remove members from consumer group"; the removal uses
kafka-python's KafkaAdminClient.remove_group_members (LeaveGroup v3+), imported only when the feature is on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson
from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition

from pipeline.kafka.kafka_python import GroupAdmin, quick_fence
from pipeline.settings import Settings

log = logging.getLogger(__name__)

LIVENESS_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(3_600_000)}


def liveness_topic(app_id: str) -> str:
    return f"{app_id}-liveness"


def beat_interval_s(bound_ms: int) -> float:
    return max(0.02, bound_ms / 4000)


@dataclass(frozen=True)
class Beat:
    """One heartbeat: who is alive, under which names the group and the transaction coordinator know it."""

    incarnation: str  # unique per process start
    member_id: str = ""  # the consumer's member id ("" until it joined)
    instance_id: str = ""  # GROUP_INSTANCE_ID ("" for a dynamic member)
    transactional_id: str = ""  # PRODUCERS=per_process: the process's producer ("" otherwise)
    stopping: bool = False  # a clean stop: not to be removed
    # > 0: not a process's beat but its supervisor's word that it restarts this instance id now (Announcer): the old
    # incarnation's place is kept for the new one this long, unless the new one's own beats stop sooner
    starting_ms: int = 0
    # Interactive queries (pipeline/core/queries.py): where this process answers them, and the input partitions it
    # owns: every process's directory of who answers for which partition
    query_address: str = ""
    partitions: tuple[int, ...] = ()
    # The committed input offset of each of `partitions` (-1: none yet): how far a standby's answer is behind
    offsets: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Beat | None:
        """None for what is not a beat; fields a later version adds are ignored (peers of two versions, mid-upgrade)."""
        try:
            fields = orjson.loads(raw)
            known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
            sequences = {name: tuple(known.get(name, ())) for name in ("partitions", "offsets")}
            return cls(**{**known, **sequences})
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            return None


@dataclass
class Peers:
    """What this process heard, on its own monotonic clock (another host's clock is never compared): the pure part of
    the detector, tested without a broker."""

    me: str  # my incarnation
    bound_s: float
    last_heard: dict[str, float] = field(default_factory=dict)  # incarnation -> when its last beat arrived
    beats: dict[str, Beat] = field(default_factory=dict)
    # (incarnation, member id) acted on, once each. Not the incarnation alone: a process removed while paused comes
    # back and rejoins under a new member id, and its next silence must count too (a soak found a paused process's
    # second pause left to the session time-out, 8 s instead of 0.5 s).
    judged: set[tuple[str, str]] = field(default_factory=set)
    last_turn: float | None = None
    unsure: bool = False  # the last turn could not tell a silent peer from a stalled channel or a paused process
    why: str = ""  # why it could not (for the log)
    starved: bool = False  # this turn came over half the bound after the last: this process did not run
    late: set[str] = field(default_factory=set)  # incarnations past half the bound, logged once per silence

    def heard(self, beat: Beat, now: float) -> None:
        self.last_heard[beat.incarnation] = now
        self.beats[beat.incarnation] = beat

    def silent(self, now: float) -> list[Beat]:
        """The peers to remove now. None while this process did not hear its own beat within half the bound (the
        channel stalls, or its reading is stuck) or was itself stopped for half the bound since its last turn (paused:
        everyone looks silent then), nor at the first turn after: every peer's silence counts again from then.

        Half the bound, not the bound: every broker killed in a cluster test stalled the heartbeat topic for everyone
        (its leader gone, or acks=all waiting for the dead follower to leave the ISR), and 0.9 s later one instance
        judged its live peer, 3 kills out of 3 (fencing its producer). With the whole bound as the test, a peer whose
        last beat before the stall landed a turn before this process's own was past the bound while this process
        still counted as hearing itself, half the time. Half the bound asks that this process heard two more beats
        of its own than of the peer. And a full bound again after the stall: the peers' producers retry their beats
        at their own pace."""
        gap_s = 0.0 if self.last_turn is None else now - self.last_turn
        paused = self.starved = gap_s > self.bound_s / 2
        self.last_turn = now
        stalled = now - self.last_heard.get(self.me, float("-inf")) > self.bound_s / 2
        if paused or stalled or self.unsure:
            self.unsure = paused or stalled
            if self.unsure:
                self.why = self._why(now, gap_s if paused else None)
            for incarnation in self.last_heard:
                if incarnation != self.me:  # its own silence ends only with its own next beat
                    self.last_heard[incarnation] = max(self.last_heard[incarnation], now)
            return []
        newest = {b.instance_id: b.incarnation for b in self.beats.values() if b.instance_id}  # dict keeps the last
        dead = []
        for incarnation, heard_at in self.last_heard.items():
            beat = self.beats[incarnation]
            if incarnation == self.me or beat.stopping or not beat.member_id:
                continue
            if (incarnation, beat.member_id) in self.judged:
                continue
            successor = newest.get(beat.instance_id, incarnation)
            if successor != incarnation and self._replaced_by(successor, incarnation, now):
                continue
            if now - heard_at > self.bound_s:
                self.judged.add((incarnation, beat.member_id))
                dead.append(beat)
        return dead

    def newly_late(self, now: float) -> list[Beat]:
        """The peers whose silence passed half the bound since the last turn (while this process hears itself): how
        close a fault came to a judgement, in the log before any judgement."""
        late = {
            i
            for i, heard_at in self.last_heard.items()
            if i != self.me and now - heard_at > self.bound_s / 2 and self.beats[i].member_id
        }
        newly, self.late = late - self.late, late
        return [] if self.unsure else [self.beats[i] for i in newly if not self.beats[i].stopping]

    def silence_ms(self, incarnation: str, now: float) -> int:
        """How long since `incarnation`'s last beat arrived here (-1: never heard)."""
        heard = self.last_heard.get(incarnation)
        return -1 if heard is None else round((now - heard) * 1000)

    def _why(self, now: float, gap_s: float | None) -> str:
        if gap_s is not None:
            return f"this process's liveness thread did not run for {gap_s * 1000:.0f} ms (paused, or starved)"
        silence_ms = self.silence_ms(self.me, now)
        if silence_ms < 0:
            return "this process's own beat not heard yet"
        return f"this process's own beat not heard for {silence_ms} ms (the heartbeat topic stalls)"

    def owner(self, partition: int, now: float) -> str | None:
        """The query address of the process that owns `partition` per the latest beats heard within the bound (the
        newest such beat if two claim it, mid-rebalance); None if none does. Called from other threads: copies."""
        claims = [
            (self.last_heard.get(b.incarnation, float("-inf")), b.query_address)
            for b in list(self.beats.values())
            if b.query_address and partition in b.partitions and not b.stopping
        ]
        fresh = [claim for claim in claims if now - claim[0] <= self.bound_s]
        return max(fresh)[1] if fresh else None

    def committed(self, partition: int, now: float) -> int | None:
        """The committed input offset of `partition` in its owner's latest beat heard within the bound (the newest
        such beat if two claim it); None if none says. From other threads, as `owner`."""
        claims = [
            (self.last_heard.get(b.incarnation, float("-inf")), b.offsets[b.partitions.index(partition)])
            for b in list(self.beats.values())
            if partition in b.partitions and len(b.offsets) == len(b.partitions) and not b.stopping
        ]
        fresh = [claim for claim in claims if now - claim[0] <= self.bound_s and claim[1] >= 0]
        return max(fresh)[1] if fresh else None

    def _replaced_by(self, successor: str, incarnation: str, now: float) -> bool:
        """Whether a static member's new incarnation (a restart under the same GROUP_INSTANCE_ID) takes the old one's
        place, so that the old one is left alone: nothing is fenced or removed, no second rebalance. Once joined, it
        replaced the old member in the group (static membership), and its own init_transactions on the same
        transactional id, before joining, aborted what the old one left open: the old one is done with (judged). While
        it beats, it is on its way there; so it is while its supervisor's announcement holds (a Python process takes
        longer to start beating than a short bound). One that stopped or fell silent before joining does not count:
        the old one is judged as any silent peer."""
        new = self.beats[successor]
        if new.member_id:
            self.judged.add((incarnation, self.beats[incarnation].member_id))
            return True
        return not new.stopping and now - self.last_heard[successor] <= max(self.bound_s, new.starting_ms / 1000)


class Announcer:
    """The supervisor's part (pipeline/supervisor.py: `pipeline run --workers N`). It restarts a crashed worker at once
    under the same static id, but the new process beats only once it has imported, connected and checked its topics:
    under load, later than a short bound. Told by its peers' detectors, the old incarnation would be removed (a
    rebalance) just before the new one joins (another). So the supervisor says on the heartbeat topic, as it starts the
    new process, that this instance id is coming back: its peers then leave the old incarnation's place to it for up
    to SESSION_TIMEOUT_MS (what static membership promises a restarted member anyway), or until the new process's own
    beats stop. Its new incarnation aborts the old one's transaction with its own init_transactions."""

    def __init__(self, settings: Settings, client_config: Mapping[str, Any], topic: str) -> None:
        self._settings, self._topic = settings, topic
        timeout = {"message.timeout.ms": settings.session_timeout_ms}  # after that, it would shield nothing
        self._producer = Producer({**client_config, "linger.ms": 0, "acks": "all", **timeout})

    def restarting(self, instance_id: str) -> None:
        if not instance_id:  # a dynamic member's new process is a new member: nothing to keep for it
            return
        beat = Beat(uuid.uuid4().hex, instance_id=instance_id, starting_ms=self._settings.session_timeout_ms)
        with contextlib.suppress(BufferError, KafkaException):  # the session time-out then ends the old one
            self._producer.produce(self._topic, beat.encode(), key=beat.incarnation.encode())
        self._producer.poll(0)
        log.info("told the peers of %s that it is restarting (%s)", instance_id, self._topic)

    def close(self) -> None:
        self._producer.flush(self._settings.request_timeout_ms / 1000)


class Liveness:
    """The heartbeat thread of one process: publishes its Beat, reads its peers', acts on the silent ones."""

    def __init__(
        self,
        settings: Settings,
        client_config: Mapping[str, Any],
        group: str,
        topic: str,
        *,
        transactional_id: str = "",
        remove: Callable[[Beat], str] | None = None,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        self.bound_ms = settings.failure_detection_ms
        self.beat = Beat(uuid.uuid4().hex, instance_id=settings.group_instance_id, transactional_id=transactional_id)
        self.peers = Peers(self.beat.incarnation, self.bound_ms / 1000)
        self._settings, self._config, self._group, self._topic = settings, dict(client_config), group, topic
        if remove is None:
            admin = GroupAdmin(settings, group)
            remove = lambda beat: admin.remove(beat.member_id, beat.instance_id)  # noqa: E731
        self._remove = remove
        self._fence = fence or self._fence_producer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._producer = Producer({**self._config, "linger.ms": 0, "acks": "all"})
        self._consumer = Consumer(
            {**self._config, "group.id": f"{group}.liveness", "enable.auto.commit": False, "fetch.wait.max.ms": 20}
        )
        self.removed: list[Beat] = []  # what this process removed (for tests and logs)

    def start(self) -> Liveness:
        """The topic exists: the runner created it with its internal topics (pipeline/sinks/kafka/takeover.py)."""
        self._consumer.assign([TopicPartition(self._topic, 0, self._first_offset())])
        self._thread.start()
        log.info("heartbeats on %s every %d ms, as %s", self._topic, beat_interval_s(self.bound_ms) * 1000, self.beat)
        return self

    def _first_offset(self) -> int:
        """Where reading starts: the beats of the last SESSION_TIMEOUT_MS, so that a peer that died just before this
        process started is heard and, silent, removed. Read from the end, it was not: a CI run killed a member a
        second after a new one started, the new one had heard none of its beats, and the group waited the session
        time-out (6 s) for it. Silence still counts on this process's clock, from when a beat is read here: an old
        beat only makes its peer a suspect, judged after the bound like any other. A member older than that window
        is out of the group by then anyway."""
        since_ms = int(time.time() * 1000) - self._settings.session_timeout_ms
        try:
            [found] = self._consumer.offsets_for_times(
                [TopicPartition(self._topic, 0, since_ms)], timeout=self._settings.request_timeout_ms / 1000
            )
        except KafkaException as e:  # the end then, as before: the session time-out covers what is missed
            log.info("heartbeats on %s read from their end (%s)", self._topic, e)
            return OFFSET_END
        return found.offset if found.error is None and found.offset >= 0 else OFFSET_END

    def joined(self, member_id: str) -> None:
        """The group consumer's member id, told by the runner from the consumer's own thread after every (re)join (a
        new one after a removed member rejoins). Never asked from this thread: confluent-kafka serializes a consumer's
        calls, so memberid() waited for the poll loop's poll (measured 1.7 s behind a 2 s poll; seconds behind a
        take-over in a callback), stopping the beats and, worse, making this process think it was paused."""
        if member_id and member_id != self.beat.member_id:
            self.beat = replace(self.beat, member_id=member_id)
            log.info("heartbeats: this process is member %s", member_id)  # what a peer's judgement names

    def serving(self, address: str, partitions: tuple[int, ...], offsets: tuple[int, ...] = ()) -> None:
        """QUERY_ENABLED: the next beats say where this process answers queries, for which input partitions, and
        their committed input offsets (-1: none yet)."""
        if (address, partitions, offsets) != (self.beat.query_address, self.beat.partitions, self.beat.offsets):
            self.beat = replace(self.beat, query_address=address, partitions=partitions, offsets=offsets)

    def owner(self, partition: int) -> str | None:
        return self.peers.owner(partition, time.monotonic())

    def committed(self, partition: int) -> int | None:
        return self.peers.committed(partition, time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.beat = Beat(**{**asdict(self.beat), "stopping": True})
        self._publish()
        self._producer.flush(self._settings.request_timeout_ms / 1000)
        self._consumer.close()

    def _run(self) -> None:
        interval = beat_interval_s(self.bound_ms)
        cpu_s = time.process_time()
        while not self._stop.is_set():
            self._publish()
            self._read()
            was_unsure = self.peers.unsure
            for beat in self.peers.silent(now := time.monotonic()):
                self._act(beat, now)
            for beat in self.peers.newly_late(now):
                log.info("member %s silent for %d ms", beat.member_id, self.peers.silence_ms(beat.incarnation, now))
            # The turns that judge nobody, and why (the first question at a fault); every time this process did not
            # run, even within a stall: a peer may have judged it meanwhile, and only this line says why it was silent
            if self.peers.unsure != was_unsure or self.peers.starved:
                log.info("heartbeats: %s", self._doubt(cpu_s) if self.peers.unsure else "heard again")
            cpu_s = time.process_time()
            self._stop.wait(interval)

    def _doubt(self, cpu_at_last_turn_s: float) -> str:
        """Why this turn judges nobody. When this thread itself did not run: how much CPU the process used meanwhile
        (none: the process was stopped or not scheduled; a lot: another thread held the interpreter) and where its
        other threads are now."""
        if not self.peers.starved:
            return f"judging nobody: {self.peers.why}"
        cpu_ms = (time.process_time() - cpu_at_last_turn_s) * 1000
        return f"judging nobody: {self.peers.why}; the process used {cpu_ms:.0f} ms of CPU meanwhile; {_threads()}"

    def _publish(self) -> None:
        with contextlib.suppress(BufferError, KafkaException):  # a missed beat is what the bound is for
            self._producer.produce(self._topic, self.beat.encode(), key=self.beat.incarnation.encode())
        self._producer.poll(0)

    def _read(self) -> None:
        for message in self._consumer.consume(1000, 0.01):
            if message.error() is None and (beat := Beat.decode(message.value() or b"")) is not None:  # b"": None
                self.peers.heard(beat, time.monotonic())

    def _act(self, beat: Beat, now: float) -> None:
        log.warning(
            "member %s (%s) silent for over %d ms (%d ms; this process's own beat heard %d ms ago): fencing its"
            " producer and removing it from the group",
            beat.member_id,
            beat.instance_id or "dynamic",
            self.bound_ms,
            self.peers.silence_ms(beat.incarnation, now),
            self.peers.silence_ms(self.peers.me, now),
        )
        if beat.transactional_id:  # beside the removal, on a thread of its own: this one keeps beating
            threading.Thread(target=self._fence_logged, args=(beat,), name="liveness-fence", daemon=True).start()
        try:
            answer = self._remove(beat)
            self.removed.append(beat)
            if answer == "UnknownMemberIdError":  # every peer that saw the silence acts; the first one removed it
                log.info("member %s already gone from group %s (removed by another peer)", beat.member_id, self._group)
            else:
                log.warning("member %s removed from group %s: %s", beat.member_id, self._group, answer)
        except Exception as e:
            log.error("could not remove member %s from group %s: %s", beat.member_id, self._group, e)

    def _fence_logged(self, beat: Beat) -> None:
        """The removal does not wait for the fence. An init_transactions that must abort an open transaction takes
        ~0.5 s (measured), and removing first starts the rebalance that much sooner. Nothing gets in before the
        fence: a new owner's committed offsets and restore wait for the silent producer's open transaction to end
        (docs/guarantees.md: zombies-stay-out, complete-restore)."""
        try:
            self._fence(beat.transactional_id)
            log.info("member %s: producer %s fenced", beat.member_id, beat.transactional_id)
        except Exception as e:
            log.error("could not fence producer %s of member %s: %s", beat.transactional_id, beat.member_id, e)

    def _fence_producer(self, transactional_id: str) -> None:
        """init_transactions under the silent process's transactional.id aborts what it left open (first through
        kafka-python, which does it in ~50 ms where librdkafka takes 0.5 s: pipeline/kafka/kafka_python.py)."""
        quick_fence(self._settings, transactional_id)
        producer = Producer({**self._config, "transactional.id": transactional_id})
        producer.init_transactions(self._settings.request_timeout_ms / 1000)
        producer.flush(1)


def _threads() -> str:
    """Every other thread's innermost frames, named: what ran while the liveness thread did not."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    where = [
        f"[{names.get(ident, ident)}] "
        + " <- ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(stack))
        for ident, frame in sys._current_frames().items()
        if ident != me and (stack := traceback.extract_stack(frame, limit=2))
    ]
    return "threads: " + "; ".join(where)
