"""Several co-partitioned inputs taken in timestamp order: the one rule both sinks' tasks follow (docs/inputs.md), so
that the order a task took is the order the checker can replay, whichever sink committed it.

    merge_order()   the topics in tie order: tables before streams, then as the App declares them
    next_run()      the records that can be taken now, in order, from per-topic queues: again and again the queue
                    whose head has the smallest timestamp (ties: the merge order) gives its records up to the next
                    smallest head, until a queue runs dry or none holds records
    must_wait()     whether an empty queue holds the others back: its topic has records on the broker not fetched
                    yet, for at most MAX_TASK_IDLE_MS since it ran dry (-1: never)
    OrderRuns       the order a transaction took its records in, as runs "index:count,..." (index into the App's
                    co-partitioned topics): what a checkpoint (Kafka sink) or a merge-order row (PostgreSQL sink)
                    records for the checker
    WaitsFromRunning  the several-input task of either sink: the bounded wait starts again each time p is RUNNING
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence

from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.kafka.records import Consumed


def merge_order(topics: Sequence[str], tables: Collection[str]) -> list[str]:
    """Tables first on equal timestamps: a stream record sees the table as of its own time, inclusive."""
    index = {topic: i for i, topic in enumerate(topics)}
    return sorted(topics, key=lambda t: (t not in tables, index[t]))


def enqueue(
    queues: Mapping[str, deque[Consumed]], positions: Mapping[str, int | None], messages: list[Consumed]
) -> None:
    """Each message into its topic's queue, unless it is below the task's position in that topic (fetched before a
    seek back: the seek fetches it again)."""
    for m in messages:
        topic = m.topic()
        position = positions[topic]
        if position is None or m.offset() >= position:
            queues[topic].append(m)


def next_run(
    queues: Mapping[str, deque[Consumed]],
    order: Sequence[str],
    rank: Mapping[str, int],
    empty_since: dict[str, float],
    waits: Callable[[str, float], bool],
    now: float,
) -> list[Consumed]:
    """Takes from `queues` what can be taken now, in timestamp order; [] when an empty queue must be waited for
    (`waits(topic, now)`). A queue that runs dry notes `now` in `empty_since`: a wait for it starts then."""
    ready = []
    for topic in order:
        if queues[topic]:
            ready.append(topic)
        elif waits(topic, now):
            return []
    taken: list[Consumed] = []
    while ready:
        keys = {t: (queues[t][0].timestamp()[1], rank[t]) for t in ready}
        best = min(ready, key=keys.__getitem__)
        bound = min((keys[t] for t in ready if t != best), default=None)
        queue = queues[best]
        while queue and (bound is None or (queue[0].timestamp()[1], rank[best]) < bound):
            taken.append(queue.popleft())
        if not queue:
            empty_since[best] = now
            break
    return taken


def must_wait(idle_s: float, empty_since: float, now: float, end_of: Callable[[], int], position: int | None) -> bool:
    """An empty queue is waited for while its topic's end (`end_of()`, the cached high watermark; < 0: not known yet)
    is beyond the task's `position`, for at most `idle_s` since it ran dry (< 0: never). The end is asked only within
    that time: every empty queue is looked at on every take."""
    if idle_s < 0 or now - empty_since >= idle_s:
        return False
    end = end_of()
    return end < 0 or (position or 0) < end


class WaitsFromRunning(Lifecycle):
    """Mixed into both sinks' several-input tasks (before their sink's task class), which keep `topics` and
    `_empty_since`: each time p starts taking records (after its fence, a restore or a rewind), the bounded wait for
    an empty input starts again, since the time p spent fencing or restoring is not time the lagging topic was
    waited for. Timed from the task's creation instead, a take-over after a restore of a few seconds found the wait
    long expired and took the streams' first records without the table updates just behind them."""

    topics: tuple[str, ...]
    _empty_since: dict[str, float]

    def _transition(self, to: Phase) -> None:
        if to is Phase.RUNNING:
            self._empty_since = dict.fromkeys(self.topics, time.monotonic())
        super()._transition(to)


class OrderRuns:
    """The order one transaction took its records in: [topic index, count] runs."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def note(self, index: int) -> None:
        runs = self.runs
        if runs and runs[-1][0] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1])

    def encode(self) -> str:
        """ "0:3,1:2": read back by pipeline.state.changelog.order_runs."""
        return ",".join(f"{i}:{n}" for i, n in self.runs)

    def clear(self) -> None:
        self.runs = []

    def __bool__(self) -> bool:
        return bool(self.runs)
