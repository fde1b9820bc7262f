"""The stalled-partition watchdog (docs/guarantees.md: no-silent-stall): an owned partition that has work and does not
move says so. A partition is stalled when this process owns it, it is not stopped (STOPPED has its own ERROR and
gauge), it has something to do (input waiting: its position below the high watermark; or a restore under way) and
it has not moved for STALL_WARNING_MS: no record processed, no restore step done.

Then: one WARNING naming p, its phase, where it stands, whether it is paused, how long it has not moved and what to
check; again at most every STALL_WARNING_MS while it lasts; an INFO once it moves again; the gauge
`pipeline_stalled_partitions`. Two full-suite runs saw a member stop making progress for minutes without a log line,
and nothing could tell why afterwards: this is the line that was missing.

Nothing is measured on the hot path. The poll loop looks once a second (PollLoop._update_gauges), from what the
consumer already knows locally (positions, cached watermarks) and what the runner keeps: a partition has moved when
what `Seen.progress` holds changed since the last look.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Collection, Hashable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from types import FrameType
from typing import NamedTuple

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import Gauge

from pipeline.core.lifecycle import Phase
from pipeline.kafka.offsets import leaders_moved, relearn_leaders

log = logging.getLogger(__name__)
_STDLIB = sysconfig.get_paths()["stdlib"]
# What the watchdog never calls stalled: a stopped partition has its ERROR and its gauge; a closed one is gone.
QUIET = frozenset({Phase.STOPPED, Phase.CLOSED})
HINTS = (
    "check: is the broker leading it reachable (the consumer's WARNINGs, librdkafka's lines in pipeline.librdkafka)? "
    "a long GC pause on that broker? an open transaction upstream holding the last stable offset? "
    "pipeline_consumer_lag of p over time"
)


# A drain of 384 partitions left some unfetched for 32 s: the consumer's prefetch was full of the others' records.
NOT_FETCHED_YET = (
    "nothing fetched for it yet: in a backlog of many partitions the consumer's prefetch may hold only others' "
    "records (queued.min.messages, queued.max.messages.kbytes: PIPELINE_KAFKA_*)"
)


class Input(NamedTuple):
    """Where an owned partition stands in one topic it reads, as the consumer knows it locally."""

    topic: str
    position: int | None  # the next offset to process (None: from the beginning)
    fetched: int | None  # the consumer's position: past what it handed out, control records included; None: unknown
    low: int | None  # the cached watermarks (from fetch responses); None: unknown
    high: int | None
    end: int | None = None  # the broker's last stable offset, when asked (BrokerEnds)

    @property
    def waiting(self) -> bool:
        """Records on the broker not handed out yet. The consumer's position, not p's: after the last record of a
        transaction, p's position stops at the commit marker, which the consumer skips."""
        at = self.fetched if self.fetched is not None else self.position if self.position is not None else self.low
        top = max((x for x in (self.high, self.end) if x is not None), default=None)
        return top is not None and at is not None and at < top

    @property
    def lag(self) -> int | None:
        """Records up to the cached high watermark that p has not processed, counted as Kafka's records-lag is: from
        the consumer's position once it is past p's. The records between were handed out and processed, or were
        control records the consumer skips: after a transaction's last record, p's position stays at the commit
        marker, and an idle partition of a transactional input read 1 for good. Records handed out and held in
        memory (a burst of timers, inputs waiting for each other) are not counted. None: unknown."""
        if self.position is None or self.high is None:
            return None
        at = self.position if self.fetched is None else max(self.position, self.fetched)
        return max(0, self.high - at)

    def __str__(self) -> str:
        where = f"{self.topic}[position {self.position}, consumer at {self.fetched}, high watermark {self.high}"
        if self.end is None:
            return f"{where}]"
        if self.high is None or self.end > self.high:
            why = "the cached high watermark is out of date: p is not being fetched"
        elif self.fetched is not None and self.end <= self.fetched < self.high:
            why = "an open transaction upstream holds p's records back from read_committed consumers"
        elif self.fetched is not None and self.fetched < self.end:
            why = "records readable on the broker, not fetched"
        else:
            why = "nothing readable waiting"
        return f"{where}, the broker's last stable offset {self.end}: {why}]"


@dataclass(frozen=True)
class Seen:
    """What the poll loop sees of one owned partition at a look; `describe` is called only for a WARNING."""

    phase: Phase
    progress: Hashable  # changes whenever p moves: its positions, or its restore's counters
    waiting: bool  # input below the high watermark, or a restore under way
    describe: Callable[[], str]  # position, high watermark, paused, ... for the WARNING


@dataclass
class _Watch:
    progress: Hashable
    moved_at: float  # when p last moved (or was first seen)
    waiting_since: float | None  # since when p has had work waiting without moving; None: nothing to do
    warned_at: float | None = None  # the last WARNING of this stall; None: not stalled


class StallWatch:
    def __init__(self, limit_ms: int, gauge: Gauge, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_ms / 1000  # 0: off
        self._gauge = gauge
        self._clock = clock
        self._watches: dict[int, _Watch] = {}
        self._looked_at: float | None = None

    def quiet(self, at_least_s: float) -> list[int]:
        """The partitions that have not moved for `at_least_s`, with work waiting or not."""
        now = self._clock()
        return [p for p, w in self._watches.items() if now - w.moved_at >= at_least_s]

    @property
    def stalled(self) -> list[int]:
        return sorted(p for p, w in self._watches.items() if w.warned_at is not None)

    def look(self, seen: Mapping[int, Seen]) -> None:
        """One look at every owned partition (p -> what the loop sees of it)."""
        if not self.limit_s:
            return
        now = self._clock()
        if self._looked_at is not None and now - self._looked_at >= self.limit_s:
            # The loop itself did not turn (LoopWatch said so): p did not move because nothing ran. The waiting
            # clocks start again, or every partition would echo the loop's WARNING.
            for watch in self._watches.values():
                watch.waiting_since = now if watch.waiting_since is not None else None
        self._looked_at = now
        for p in [p for p in self._watches if p not in seen]:
            self._ended(p, self._watches.pop(p), now, "is no longer owned")
        for p, s in seen.items():
            self._look_at(p, s, now)
        self._gauge.set(len(self.stalled))

    def _look_at(self, p: int, s: Seen, now: float) -> None:
        watch = self._watches.get(p)
        waiting = s.waiting and s.phase not in QUIET
        if watch is None or s.progress != watch.progress:
            if watch is not None:
                self._ended(p, watch, now, "moves again")
            self._watches[p] = _Watch(s.progress, now, now if waiting else None)
        elif not waiting:  # nothing to do is no stall: the clock starts when input arrives
            self._ended(p, watch, now, f"has nothing to do any more ({s.phase.name})")
            watch.waiting_since = None
        elif watch.waiting_since is None:
            watch.waiting_since = now
        elif now - watch.waiting_since >= self.limit_s and (
            watch.warned_at is None or now - watch.warned_at >= self.limit_s
        ):
            watch.warned_at = now
            log.warning(
                "p%d stalled: %s, no progress for %.0f s with work waiting: %s. STALL_WARNING_MS=%d; %s",
                p,
                s.phase.name,
                now - watch.moved_at,
                s.describe(),
                round(self.limit_s * 1000),
                HINTS,
            )

    def _ended(self, p: int, watch: _Watch, now: float, how: str) -> None:
        if watch.warned_at is not None:
            log.info("p%d %s after %.0f s without progress", p, how, now - watch.moved_at)
            watch.warned_at = None


class BrokerEnds:
    """The broker's last stable offsets of the partitions that have not moved for a while. The cached high watermark
    comes with fetch responses: a fetcher that gets none for p keeps an old one, and p, left behind, looks caught up
    (to the look, and to pipeline_consumer_lag). And the high watermark alone cannot tell records not fetched from
    records an open transaction holds back. So: one ListOffsets request (read_committed) for such partitions at most
    once per STALL_WARNING_MS, never waited for (its answer is read at a later look); an end is kept until the
    consumer's position passes it.

    An answer that says the partition leaders moved (FENCED_LEADER_EPOCH after a broker restart) makes the admin
    client ask for those topics' metadata again, without waiting (relearn_leaders says why it would not by itself):
    the same answer came back every period for minutes, each one an INFO line per partition. Failed answers are
    logged once, until one is answered again."""

    def __init__(self, every_s: float, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._timeout_s, self._clock = every_s, timeout_s, clock
        self._asked_at = float("-inf")
        self._pending: dict[TopicPartition, Future[object]] = {}
        self._admin: AdminClient | None = None  # the one asked last: told to relearn the leaders
        self._failing = False  # the last answer had failures (logged once)
        self.ends: dict[tuple[str, int], int] = {}  # (topic, p) -> the broker's last stable offset

    def ask(self, admin: AdminClient | None, tps: Collection[TopicPartition]) -> None:
        """Asks about `tps` unless a request is out or one went less than a period ago."""
        now = self._clock()
        if admin is None or not tps or self._pending or now - self._asked_at < self._every_s:
            return
        self._asked_at, self._admin = now, admin
        request = {tp: OffsetSpec.latest() for tp in tps}
        try:
            self._pending = admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self._timeout_s
            )
        except Exception as e:  # the watchdog never stops the loop: it looks again next period
            log.info("stall watchdog: could not ask the broker for end offsets: %s", e)

    def collect(self) -> None:
        """Takes in the answers of a request that is done."""
        if not self._pending or not all(f.done() for f in self._pending.values()):
            return
        failed = {tp: error for tp, future in self._pending.items() if (error := future.exception()) is not None}
        for tp, future in self._pending.items():
            if tp not in failed:
                self.ends[(tp.topic, tp.partition)] = future.result().offset  # type: ignore[attr-defined]
        self._pending = {}
        moved = sorted({tp.topic for tp, error in failed.items() if leaders_moved(error)})
        if moved and self._admin is not None:
            relearn_leaders(self._admin, moved, self._timeout_s)
        if failed and not self._failing:
            log.info(
                "stall watchdog: no end offsets for %s (%s)%s; asked again every period, not logged until answered",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in failed),
                next(iter(failed.values())),
                "; partition leaders moved: their metadata asked for again" if moved else "",
            )
        self._failing = bool(failed)

    def reached(self, topic: str, p: int, position: int | None) -> None:
        """The consumer's position of p: an end it passed is no longer needed."""
        end = self.ends.get((topic, p))
        if end is not None and position is not None and position > end:
            del self.ends[(topic, p)]


class LoopWatch:
    """The poll loop itself stuck (a call that does not return: a commit, a callback, a blocked process()): every
    partition stalls, and the partition watchdog, which runs on the loop, cannot say so. /live answers 503 but
    writes no line. A daemon thread looks once a second: a loop that has not turned for STALL_WARNING_MS gets a
    WARNING with where it is (the loop thread's innermost frames), again every period, and an INFO once it turns."""

    def __init__(
        self, limit_ms: int, turned_at: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit_s = limit_ms / 1000
        self._turned_at, self._clock = turned_at, clock
        self._loop_thread: int | None = None
        self._warned: tuple[float, float] | None = None  # (the turn warned about, when)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """From the loop's thread: watches it."""
        if not self.limit_s:
            return
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="loop-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.check()

    def check(self) -> None:
        now, turned = self._clock(), self._turned_at()
        if self._warned is not None and turned != self._warned[0]:
            log.info("the poll loop turns again after %.0f s", turned - self._warned[0])
            self._warned = None
        if now - turned < self.limit_s or (self._warned is not None and now - self._warned[1] < self.limit_s):
            return
        self._warned = (turned, now)
        log.warning(
            "the poll loop has not turned for %.0f s: no partition of this process moves meanwhile. It is in: %s. "
            "STALL_WARNING_MS=%d; a call to a broker or the database that does not return (their time-outs: "
            "REQUEST_TIMEOUT_MS, TRANSACTION_TIMEOUT_MS), or process() blocked",
            now - turned,
            self._where(),
            round(self.limit_s * 1000),
        )

    def _where(self) -> str:
        frames = sys._current_frames()
        if (frame := frames.get(self._loop_thread or -1)) is None:
            return "(the loop's thread is gone)"
        where = _project_frames(frame, 8)
        # A loop waiting on the commit threads (per-partition transactions) is stuck where they are: say that too.
        names = {t.ident: t.name for t in threading.enumerate()}
        helpers = [
            f"[{names[ident]}] {_project_frames(f, 3)}"
            for ident, f in frames.items()
            if names.get(ident, "").startswith(("commit", "pg-commit")) and _project_frames(f, 1)
        ]
        return where + "".join(f"; {h}" for h in helpers[:4])


def _project_frames(frame: FrameType, limit: int) -> str:
    """The innermost project frames of a stack: they say which step is stuck; the standard library's (a future's
    wait) only how."""
    frames = [f for f in traceback.extract_stack(frame, limit=30) if not f.filename.startswith(_STDLIB)][-limit:]
    return " <- ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(frames))
