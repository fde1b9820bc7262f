"""What every runner shares: subscribe with rebalance callbacks, poll until stopped (SIGTERM/SIGINT), shut down
cleanly, serve /metrics and /ready while running, and the take-over details both runners need (resume after assign,
the pause of a dropped or stopped partition, when to take a fenced partition over again). Runners supply open(),
_loop_once(), _on_assign(), _close_partition(), _owned_partitions() and _shutdown()."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.core.processing import log_stop
from pipeline.core.queries import Queries, serve_promptly
from pipeline.core.schedule import Schedule
from pipeline.core.stall import NOT_FETCHED_YET, QUIET, BrokerEnds, Input, LoopWatch, Seen, StallWatch
from pipeline.endpoint import health_server
from pipeline.kafka.coverage import GroupCoverage
from pipeline.kafka.kafka_python import GroupAdmin
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.settings import CLASSIC, CONSUMER, ConfigError, Settings, live_timeout_ms

log = logging.getLogger(__name__)
# Longest wait for the first record when no commit is due sooner: how often an idle loop looks at its timers (drops,
# gauges). Records are handed over as they arrive, whatever this is.
IDLE_WAIT_S = 0.1
# While a restore or a rewind is under way: its steps run between polls.
BUSY_WAIT_S = 0.01
# After a partition was dropped (Kafka: fenced or fatal producer; PostgreSQL: our epoch check failed): take it over
# again only after this long, and only if the group still gives it to this process.
REFENCE_AFTER_S = 2.0


class FatalRunnerError(RuntimeError):
    """The process cannot go on (e.g. a partition cannot be fenced within the time-outs)."""


class PollLoop:
    consumer: Consumer | None
    app_id: str  # the group's id
    input_topic: str
    # On a lost partition (membership expired): the Kafka runner must not commit (someone else may own it);
    # the PostgreSQL runner may try, because its epoch check decides.
    commit_on_lost = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.consumer = None
        # Told by the tasks when a batch opens and when a partition waits for a seek or a restore step: the loop
        # never asks every partition every turn (pipeline/core/schedule.py).
        self.schedule = Schedule(settings.commit_interval_ms, settings.commit_max_records)
        self._stop = threading.Event()
        self.all_stopped = False  # the run ended because every owned partition stopped (fail-fast)
        self._next_gauge_update = 0.0
        self.stall = StallWatch(settings.stall_warning_ms, self.metrics.stalled)
        self.ends = BrokerEnds(settings.stall_warning_ms / 1000, settings.request_timeout_ms / 1000)
        self.paused: set[int] = set()  # the partitions this loop paused (librdkafka does not say)
        self._turned_at = time.monotonic()  # the poll loop's last turn: /live
        self.on_join: Callable[[str], None] = lambda member_id: None  # after every (re)join: the member id
        self.loop_watch = LoopWatch(settings.stall_warning_ms, lambda: self._turned_at)
        self.coverage: GroupCoverage | None = None  # run() makes it: the group's id is the runner's

    def run(self) -> None:
        self.open()
        if self.settings.group_protocol == CONSUMER:
            log.info(
                "GROUP_PROTOCOL=consumer (KIP-848): the broker assigns partitions; session time-out and heartbeat "
                "interval are the group's (SESSION_TIMEOUT_MS and HEARTBEAT_INTERVAL_MS do not apply)"
            )
        queries = self._queries() if self.settings.query_enabled else None
        if queries is not None:
            serve_promptly()
        routes = queries.route if queries is not None else None
        health = health_server(self.settings, self.metrics, self.is_ready, self.is_live, routes)  # before subscribing
        if health is not None:
            health.start()
        self.coverage = self._group_coverage()
        self.input.subscribe(
            [self.input_topic], on_assign=self._assigned, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self.loop_watch.start()
        try:
            while not self._stop.is_set():
                self._turned_at = time.monotonic()
                self._loop_once()
        except Exception:  # the command prints one line; the log keeps where it came from
            log.critical("the poll loop stopped on an error it does not handle", exc_info=True)
            raise
        finally:
            self.loop_watch.stop()
            if self.coverage is not None:
                self.coverage.stop()
            self._shutdown()
            if health:
                health.stop()

    @property
    def input(self) -> Consumer:
        """The input consumer, which open() creates."""
        if self.consumer is None:
            raise RuntimeError("the runner is not open: open() creates the input consumer")
        return self.consumer

    def stop(self) -> None:
        self._stop.set()

    def _close_input(self) -> None:
        """Closes the input consumer, leaving the group. An assignment waiting in the consumer is served first by a
        poll, where the stop makes `_assigned` take nothing over. Served inside close() instead, librdkafka's own
        assign after the callback can wait forever (confluentinc/librdkafka issue 4884): a CI run's runner hung in
        close() until the test's 300 s ran out. A record that poll returns is dropped: nothing is processed after the
        stop."""
        self._stop.set()  # on an error's way out too: whatever is assigned now is left to the next owner
        self.input.poll(0)
        self.input.close()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def is_live(self, now: float | None = None) -> bool:
        """The poll loop turned within LIVE_TIMEOUT_MS: a loop stuck longer (a call that never returns, a deadlock)
        makes /live answer 503, so that the orchestrator restarts the process."""
        elapsed = (time.monotonic() if now is None else now) - self._turned_at
        return elapsed * 1000 < live_timeout_ms(self.settings)

    def is_ready(self) -> bool:
        return all(owned.phase is Phase.RUNNING for owned in self._owned_partitions().values())

    def _owned(self) -> int:
        return len(self._owned_partitions())

    def _update_gauges(self) -> None:
        """Readiness, the last turn, lag and the stall watchdog, at most once a second."""
        now = time.monotonic()
        if now < self._next_gauge_update:
            return
        self._next_gauge_update = now + 1.0
        self.metrics.loop_turned.set(time.time())
        self.metrics.ready.set(1 if self.is_ready() else 0)
        self._count_stopped()
        owned = {p: o for p, o in self._owned_partitions().items() if o.phase not in QUIET}
        inputs = self._inputs(owned)
        for p, o in owned.items():
            if o.phase is not Phase.RUNNING:
                continue
            for i in inputs[p]:
                if (lag := i.lag) is not None:
                    self.metrics.input_lag.labels(i.topic, str(p)).set(lag)
                    if i.topic == self.input_topic:
                        self.metrics.lag.labels(str(p)).set(lag)
        self.stall.look({p: self._seen(p, o, inputs[p]) for p, o in owned.items()})
        self._ask_ends(owned, inputs)
        if self.coverage is not None:
            self.coverage.member_id = self.input.memberid() or ""

    def _group_coverage(self) -> GroupCoverage | None:
        """The look for input partitions nobody owns (pipeline/kafka/coverage.py), on a thread of its own: classic
        protocol only (under KIP-848 the broker reconciles), never fatal to start."""
        s = self.settings
        if s.group_protocol != CLASSIC or self._admin_client() is None:  # None: a runner without a broker (tests)
            return None
        try:
            admin = GroupAdmin(s, self.app_id)
        except ConfigError as e:  # a security property kafka-python cannot take: said, never fatal here
            log.warning("input partitions nobody owns will not be looked for: %s", e)
            return None
        bound_s = s.session_timeout_ms / 1000
        return GroupCoverage(self.app_id, self.input_topic, bound_s, self.metrics.unowned, admin).start()

    def _ask_ends(self, owned: Mapping[int, Lifecycle], inputs: Mapping[int, list[Input]]) -> None:
        """The partitions that have not moved for a period: does one that looks caught up have records waiting (its
        cached watermark stale)? Does an open transaction hold one back?"""
        if not self.stall.limit_s:
            return
        quiet = [
            p for p in self.stall.quiet(self.stall.limit_s) if p in owned and owned[p].phase is not Phase.RESTORING
        ]
        self.ends.ask(self._admin_client(), [TopicPartition(i.topic, p) for p in quiet for i in inputs[p]])

    def _inputs(self, owned: Mapping[int, Lifecycle]) -> dict[int, list[Input]]:
        """p -> where p stands in each topic it reads: local calls only (the watermarks are cached from fetch
        responses, the positions are the consumer's own), one position() call for all."""
        positions = {p: self._positions(o) for p, o in owned.items()}
        watched = self.stall.limit_s > 0  # the consumer's positions serve only the watchdog: none when it is off
        tps = [TopicPartition(t, p) for p, by_topic in positions.items() for t in by_topic] if watched else []
        try:
            fetched = {(tp.topic, tp.partition): tp.offset for tp in self.input.position(tps)} if tps else {}
        except KafkaException as e:  # the look never stops the loop: p's own position stands in this time
            log.info("consumer positions not known (%s)", e)
            fetched = {}
        found: dict[int, list[Input]] = {}
        self.ends.collect()
        for p, by_topic in positions.items():
            found[p] = []
            for topic, position in by_topic.items():
                cached = self.input.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                at, low, high = (x if x >= 0 else None for x in (fetched.get((topic, p), -1), *cached))
                self.ends.reached(topic, p, at)
                found[p].append(Input(topic, position, at, low, high, self.ends.ends.get((topic, p))))
        return found

    def _seen(self, p: int, owned: Lifecycle, inputs: list[Input]) -> Seen:
        """What the stall watchdog looks at: a restoring p moves with its restore, any other with its positions."""
        if owned.phase is Phase.RESTORING:
            return Seen(owned.phase, ("restore", self._restore_progress(p)), True, lambda: self._describe(p, inputs))
        progress = tuple((i.position, i.fetched) for i in inputs)
        waiting = any(i.waiting for i in inputs)
        return Seen(owned.phase, progress, waiting, lambda: self._describe(p, inputs))

    def _describe(self, p: int, inputs: list[Input]) -> str:
        """For the stall WARNING: where p stands, whether it is paused and assigned in the consumer, and what the
        runner knows (a restore's step, a take-over's retry)."""
        assigned = {tp.partition for tp in self.input.assignment() if tp.topic == self.input_topic}
        parts = [
            ", ".join(map(str, inputs)),
            "paused by this process" if p in self.paused else "not paused",
            "assigned in the consumer" if p in assigned else "NOT assigned in the consumer",
        ]
        if p in assigned and p not in self.paused and all(i.fetched is None for i in inputs):
            parts.append(NOT_FETCHED_YET)
        return "; ".join([*parts, *self._stall_detail(p)])

    def _admin_client(self) -> AdminClient | None:
        """The runner's admin client, which the stall watchdog asks for end offsets (None: it never asks)."""
        return None

    def _restore_progress(self, p: int) -> object:
        """Changes whenever p's restore takes a step (each runner knows its restores)."""
        return None

    def _stall_detail(self, p: int) -> list[str]:
        """What else the runner knows about a stalled p, for the WARNING."""
        return []

    def _positions(self, owned: Lifecycle) -> dict[str, int | None]:
        """topic -> the next offset to process, of every topic the owner of p reads (the Kafka runner's tasks of an
        App with several inputs read more than the input)."""
        return {self.input_topic: owned.next_offset}

    def _poll(self, longest_wait_s: float) -> list[Message]:
        """Records as soon as there are any: waits for the first one, at most `longest_wait_s` and never past the
        moment the earliest open transaction is due, then takes what is already fetched (up to POLL_MAX_RECORDS)
        without waiting. consume(n, timeout) waits for n records or the whole timeout: at low load every record
        waited for a batch that never filled (100 ms, whatever COMMIT_INTERVAL_MS), and commits came late by as much."""
        wait = longest_wait_s
        due = self._next_commit_deadline()
        if due is not None:
            wait = min(wait, max(0.0, due - time.monotonic()))
        first = self.input.poll(wait)
        if first is None:
            return []
        rest = self.settings.poll_max_records - 1
        return [first, *self.input.consume(rest, 0)] if rest else [first]

    def _next_commit_deadline(self) -> float | None:
        return self.schedule.deadline()

    def _to_commit(self, now: float) -> list[int]:
        """The partitions to commit now: once one partition's transaction is due, every open one commits with it
        (in parallel). The loop then pauses once per commit interval instead of once per partition, and the
        partitions stay in step (as Kafka Streams commits all its tasks together); each still commits within
        COMMIT_INTERVAL_MS. The schedule starts over: the caller commits (or aborts) every one of them."""
        due = self.schedule.deadline()
        if due is None or now < due:
            return []
        self.schedule.restart()
        return [
            p
            for p, owned in self._owned_partitions().items()
            if owned.phase is Phase.RUNNING and owned.commit_deadline() is not None
        ]

    def _by_partition(self, messages: list[Message]) -> dict[int, list[Consumed]]:
        """Consumed records grouped by input partition, in order; a fatal consumer error ends the process."""
        batches: dict[int | None, list[Message]] = defaultdict(list)
        for m in messages:
            if (error := m.error()) is not None:
                # _FATAL itself is not fatal(): under KIP-848 a restarted static member refused by the broker
                # (UNRELEASED_INSTANCE_ID) arrives so, and would run on outside the group, never restarted.
                if error.fatal() or error.code() == KafkaError._FATAL:
                    raise FatalRunnerError(f"consumer: {error}")
                if error.code() == KafkaError._AUTO_OFFSET_RESET:  # auto.offset.reset=error (kafka/clients.py)
                    # A partition's error: it names the topic and partition (None only for a client-wide error).
                    self._input_records_deleted(cast(str, m.topic()), cast(int, m.partition()), error.str())
                    continue
                log.warning("consumer: %s", error)
                continue
            batches[m.partition()].append(m)
        return cast(dict[int, list[Consumed]], batches)  # errors dropped above: records, with their coordinates

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.on_join(consumer.memberid() or "")  # here, on the consumer's thread: from another, memberid() waits
        if partitions and self._stop.is_set():
            # Served by the close() of a stopping consumer: taken over there, the offsets' read timed out and SIGTERM
            # ended the process with code 1 (a CI fault run). Nothing of them was processed here: nothing to commit.
            log.info(
                "assigned %s after the stop was asked: left to the next owner", [tp.partition for tp in partitions]
            )
            return
        # Cooperative rebalancing often hands out nothing new. Do not ask the coordinator about "no partitions":
        # committed([]) inside this callback was seen to time out for 30 s in a busy group, and block SIGTERM.
        if partitions:
            self._on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            log.info("revoked %s: committing what is open", [tp.partition for tp in partitions])
        for tp in partitions:
            self._close_partition(tp.partition, commit=True)
        self.metrics.assigned.set(self._owned())

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        what = (
            "committing what is open only if our epoch still holds"
            if self.commit_on_lost
            else "aborting what is open, committing nothing"
        )
        log.warning("lost %s (membership expired): %s", [tp.partition for tp in partitions], what)
        self.metrics.lost.inc(len(partitions))
        for tp in partitions:
            self._close_partition(tp.partition, commit=self.commit_on_lost)
        self._after_lost()
        self.metrics.assigned.set(self._owned())

    def _after_lost(self) -> None:
        """What a sink does once its membership expired, beyond closing the partitions (the Kafka runner's: a new
        per-process producer)."""

    # -- taking partitions over ---------------------------------------------------------------------------------------
    def _resume_assigned(self, partitions: list[int]) -> None:
        """Resumes partitions just assigned (or taken over while assigned). librdkafka keeps a pause across
        unassign/assign: without this a partition paused by a drop (fenced) and then lost or taken over again stayed
        paused for good (seen in a chaos zombie run)."""
        self.input.resume([tp for p in partitions for tp in self._topic_partitions(p)])
        self.paused.difference_update(partitions)

    def _pause(self, p: int) -> None:
        self.input.pause(self._topic_partitions(p))
        self.paused.add(p)

    def _resume(self, p: int) -> None:
        self.input.resume(self._topic_partitions(p))
        self.paused.discard(p)

    def _topic_partitions(self, p: int) -> list[TopicPartition]:
        """Every partition the task of p reads: partition p of the input (a runner with several inputs adds theirs)."""
        return [TopicPartition(self.input_topic, p)]

    def _stop_partition(self, owned: Lifecycle, error: Exception) -> None:
        """p stops where the failing record is, paused, until an operator restarts the process (the runner has
        committed what came before it): never silently (docs/guarantees.md: fail-fast). An ERROR, the stopped
        partitions gauge, /ready false; once every partition of this process stopped, the process ends (run_service
        returns PARTITIONS_STOPPED_EXIT)."""
        log_stop(owned.partition, owned.next_offset, error)
        owned.stop(str(error))
        self._pause(owned.partition)
        self.metrics.ready.set(0)
        self._count_stopped()

    def _count_stopped(self) -> None:
        owned = self._owned_partitions().values()
        stopped = sum(1 for o in owned if o.phase is Phase.STOPPED)
        self.metrics.stopped.set(stopped)
        if owned and stopped == len(owned) and not self.all_stopped:
            log.error(
                "every partition of this process stopped (%d): the process ends, not a zombie that polls", stopped
            )
            self.all_stopped = True
            self.stop()

    # -- supplied by each runner -------------------------------------------------------------------------------------
    def _queries(self) -> Queries | None:
        """QUERY_ENABLED: what answers queries of this runner's committed state (None: the sink cannot)."""
        log.warning("QUERY_ENABLED: the %s sink does not answer queries yet", self.settings.sink)
        return None

    def open(self) -> None:
        raise NotImplementedError

    def _owned_partitions(self) -> Mapping[int, Lifecycle]:
        """p -> its task (Kafka sink) or worker (PostgreSQL sink), for every partition this process owns."""
        raise NotImplementedError

    def _loop_once(self) -> None:
        raise NotImplementedError

    def _input_records_deleted(self, topic: str, p: int, detail: str) -> None:
        """p's position is below its topic's log start: p commits what it has and stops (InputRecordsDeleted)."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        raise NotImplementedError

    def _close_partition(self, p: int, commit: bool) -> None:
        raise NotImplementedError
