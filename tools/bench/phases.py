"""`python -m tools.bench --phases`: where each loop thread's CPU goes, per record, on the broker (issue 33).

The rates of one cell swing by a quarter from run to run on a shared two-core machine, so a change worth a tenth is
lost in them. The loop thread's CPU time per record moves much less: it is what the ratio eos / hand is made of once
the hand loop runs at the broker's pace and ours does not. With `--phases`, every run of the bench times, in the CPU
time of the calling thread (`time.thread_time`), the steps of the loop that ran it:

    ours (KafkaRunner)   turn (KafkaRunner._loop_once, the whole loop), and within it: consume (PollLoop._poll),
                         process (KafkaTask._process: decode, `process`, encode, produce), delivery reports
                         (Transaction.poll), commits (KafkaRunner._commit_due)
    hand, raw (RawLoop)  turn (RawLoop._loop, the whole loop), and within it: process (the batch function)

and prints them as microseconds per input record of the run. The timers cost a few calls per poll, not per record.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.core.loop import PollLoop
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import Transaction

# (class, method, phase): what is timed in ours; the hand and raw loops are timed by RawLoop itself (`timed`).
OURS = (
    (KafkaRunner, "_loop_once", "turn"),
    (PollLoop, "_poll", "consume"),
    (KafkaTask, "_process", "process"),
    (Transaction, "poll", "delivery reports"),
    (KafkaRunner, "_commit_due", "commits"),
)


class Phases:
    """CPU seconds of the calling threads by phase, since the last `take`."""

    def __init__(self) -> None:
        self.cpu: defaultdict[str, float] = defaultdict(float)

    def timed(self, phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                self.cpu[phase] += time.thread_time() - started

        return timed_call

    @contextlib.contextmanager
    def installed(self) -> Iterator[Phases]:
        """Ours' steps timed while inside (the methods patched on their classes, put back on the way out)."""
        originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in OURS]
        for owner, name, phase in OURS:
            setattr(owner, name, self.timed(phase, getattr(owner, name)))
        try:
            yield self
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)

    def take(self, records: int) -> str:
        """The line of one run: each phase in µs per record, the whole turn first; the counts start over."""
        taken, self.cpu = self.cpu, defaultdict(float)
        if not records or not taken:
            return "phases: nothing timed"
        order = ["turn", *sorted(p for p in taken if p != "turn")]
        return "phases, loop-thread CPU per record: " + ", ".join(
            f"{p} {1e6 * taken[p] / records:.2f} µs" for p in order if p in taken
        )
