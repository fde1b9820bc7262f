"""Client calls that return by a deadline even when librdkafka does not.

librdkafka's transactional calls take a time-out, and mostly keep it. Not always: a coordinator that dies can leave the
call's request waiting for a broker state change that never comes (confluentinc/librdkafka#5456: the coordinator
request's time-out is never checked; #5511: a decommissioned coordinator stays cached). A CI cluster run had an
instance's commit_transaction, given 10 s, still blocked 270 s after the fills' leader was killed and restarted: its
poll loop never turned again, the group waited for it, and the other instance sat with nothing assigned until the test
gave up.

So each such call runs on a worker thread while the caller waits at most the call's own time-out plus a grace. Past
that, CallHung: the caller gives the producer up (its partitions are dropped and taken over again with a new producer,
whose init_transactions fences whatever the hung one might still send). The worker stays blocked in librdkafka; it is
a daemon thread, so it never holds up the process's exit, and it is never handed another call.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_idle: collections.deque[_Worker] = collections.deque()  # workers waiting for a call (append and pop are atomic)
os.register_at_fork(after_in_child=_idle.clear)  # a forked child has none of its parent's threads


class CallHung(Exception):
    """A client call that did not return within its own time-out plus the grace."""

    def __init__(self, operation: str, waited_s: float) -> None:
        super().__init__(
            f"{operation} did not return within {waited_s:.1f} s, past its own time-out (a librdkafka hang after a"
            " coordinator died: confluentinc/librdkafka#5456); the producer is given up"
        )


def grace_s(timeout_s: float) -> float:
    """How long past its own time-out a call is waited for: librdkafka overshoots a little when it keeps it."""
    return max(1.0, timeout_s / 2)


def within(timeout_s: float, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, its result or its exception; CallHung if it has not returned `timeout_s` + grace_s from now."""
    job = _Job(call, args)
    worker = _idle.pop() if _idle else _Worker()
    worker.give(job)
    waited_s = timeout_s + grace_s(timeout_s)
    if not job.done.wait(waited_s):
        raise CallHung(getattr(call, "__name__", repr(call)), waited_s)
    if job.error is not None:
        raise job.error
    return job.result  # type: ignore[no-any-return]


class _Job:
    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.call, self.args = call, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call(*self.args)
        except BaseException as e:  # handed to the caller, which raises it in its own thread
            self.error = e
        finally:
            self.call = self.args = None  # type: ignore[assignment]  # nothing kept alive past the call
            self.done.set()


class _Worker:
    def __init__(self) -> None:
        self._jobs: collections.deque[_Job] = collections.deque()
        self._ready = threading.Semaphore(0)
        threading.Thread(target=self._run, name="client-call", daemon=True).start()

    def give(self, job: _Job) -> None:
        self._jobs.append(job)
        self._ready.release()

    def _run(self) -> None:
        while True:
            self._ready.acquire()
            self._jobs.popleft().run()
            _idle.append(self)  # only once the call returned: a hung worker is never handed another
