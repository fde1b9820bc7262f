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
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from prometheus_client import Gauge

from pipeline.core.lifecycle import Phase

log = logging.getLogger(__name__)
# What the watchdog never calls stalled: a stopped partition has its ERROR and its gauge; a closed one is gone.
QUIET = frozenset({Phase.STOPPED, Phase.CLOSED})
HINTS = (
    "check: is the broker leading it reachable (the consumer's WARNINGs, librdkafka's lines in pipeline.librdkafka)? "
    "a long GC pause on that broker? an open transaction upstream holding the last stable offset? "
    "pipeline_consumer_lag of p over time"
)


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
    since: float  # when p last moved (or last had nothing to do)
    warned_at: float | None = None  # the last WARNING of this stall; None: not stalled


class StallWatch:
    def __init__(self, limit_ms: int, gauge: Gauge, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_ms / 1000  # 0: off
        self._gauge = gauge
        self._clock = clock
        self._watches: dict[int, _Watch] = {}

    @property
    def stalled(self) -> list[int]:
        return sorted(p for p, w in self._watches.items() if w.warned_at is not None)

    def look(self, seen: Mapping[int, Seen]) -> None:
        """One look at every owned partition (p -> what the loop sees of it)."""
        if not self.limit_s:
            return
        now = self._clock()
        for p in [p for p in self._watches if p not in seen]:
            self._end(p, now, "no longer owned")
        for p, s in seen.items():
            self._look_at(p, s, now)
        self._gauge.set(len(self.stalled))

    def _look_at(self, p: int, s: Seen, now: float) -> None:
        watch = self._watches.get(p)
        if watch is None:
            self._watches[p] = _Watch(s.progress, now)
            return
        if s.progress != watch.progress:
            self._end(p, now, "moves again")
            self._watches[p] = _Watch(s.progress, now)
        elif s.phase in QUIET or not s.waiting:
            # Nothing to do is no stall: the clock starts when input arrives.
            self._end(p, now, f"has nothing to do any more ({s.phase.name})")
            self._watches[p] = _Watch(s.progress, now)
        elif now - watch.since >= self.limit_s and (watch.warned_at is None or now - watch.warned_at >= self.limit_s):
            watch.warned_at = now
            log.warning(
                "p%d stalled: %s, no progress for %.0f s with work waiting: %s. STALL_WARNING_MS=%d; %s",
                p,
                s.phase.name,
                now - watch.since,
                s.describe(),
                round(self.limit_s * 1000),
                HINTS,
            )

    def _end(self, p: int, now: float, how: str) -> None:
        watch = self._watches.pop(p)
        if watch.warned_at is not None:
            log.info("p%d %s after %.0f s stalled", p, how, now - watch.since)
