"""The cyclic garbage collector of a running service, run on the poll loop's thread only.

Python collects whenever an allocation crosses a threshold, on whatever thread allocated. confluent-kafka resolves an
admin client's futures on a librdkafka thread, in Python. A collection there that frees a Kafka client left in a
reference cycle destroys the client's handle from librdkafka's own thread, and librdkafka aborts the whole process
(`Fatal Python error: Aborted`, `Garbage-collecting`): a CI run lost a whole test lane so, and confluent-kafka's own
tests work around the same abort. So while a runner runs, automatic collection is off and the loop collects between
its turns, by Python's own counts: the oldest generation whose count is over its threshold. A full collection (the
oldest generation) also waits until the time since the last one is `FULL_BUDGET` times what that one took: Python
holds full collections back until the objects new since the last one are a quarter of the heap, a count it does not
expose; by the thresholds alone every tenth collection of the middle generation would scan the whole heap.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from types import TracebackType

FULL_BUDGET = 20  # a full collection at most every 20x its own duration: at most 5 % of the loop's time


class LoopCollector:
    """`with LoopCollector() as collector:` automatic collection off (as it was before, after); `collector.turn()`
    once per loop turn collects what Python would have."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._thresholds = gc.get_threshold()
        self._was_enabled = False
        self._full_at = self._full_took = 0.0

    def __enter__(self) -> LoopCollector:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._was_enabled:
            gc.enable()

    def turn(self) -> None:
        counts = gc.get_count()
        oldest = len(counts) - 1
        for generation in range(oldest, -1, -1):
            if counts[generation] <= self._thresholds[generation]:
                continue
            if generation == oldest and not self._full_due():
                continue
            started = self._clock()
            gc.collect(generation)
            if generation == oldest:
                self._full_at, self._full_took = self._clock(), self._clock() - started
            return

    def _full_due(self) -> bool:
        return self._clock() - self._full_at >= FULL_BUDGET * self._full_took
