"""The one way anything here tries again: a `Backoff` (how long to wait after the n-th failure) and `retry` (call
until it succeeds, a failure is final, the attempts run out, or the next attempt would start past the deadline).

Loops that block retry with `retry`: a transactional producer call whose outcome is unknown, the fence, the committed
offsets, a record or a timer that failed, end offsets, topic metadata and creation, the permission check, a PostgreSQL
connection and its schema. Waiting is not retrying: a full producer queue (poll until it drains) and the supervisor
watching its children are plain loops. Retries spread over poll-loop turns (a partition
taken over again after a PostgreSQL failure, a supervised worker started again) keep a failure count and ask
`Backoff.delay` when to try next.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Waits `first_s` after the first failure, then `factor` times longer after each further one, at most `max_s`
    (factor 1: a fixed wait)."""

    first_s: float
    factor: float = 2.0
    max_s: float = math.inf

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1 for the first)."""
        return min(self.max_s, self.first_s * self.factor ** max(0, failures - 1))


def retry(
    call: Callable[[], T],
    *,
    retriable: Callable[[Exception], bool],
    backoff: Backoff,
    attempts: int | None = None,
    within_s: float | None = None,
    first_error: Exception | None = None,
    on_failure: Callable[[Exception, int, float | None], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call()`'s result. A failure (an Exception) is tried again after `backoff.delay(failures)` while it is
    `retriable`, fewer than `attempts` attempts were made (None: no limit) and the next attempt would start within
    `within_s` of the first (None: no limit); otherwise it is raised as it is.

    `first_error`: the first attempt was already made by the caller and failed so (the hot paths make it inline).
    `on_failure(error, failures, delay)` runs after every failed attempt, before the wait: `delay` is None when the
    error is about to be raised (undo what the attempt changed, count it, log it there)."""
    deadline = None if within_s is None else clock() + within_s
    failures, error = 0, first_error
    while True:
        if error is not None:
            failures += 1
            delay = backoff.delay(failures)
            final = (
                not retriable(error)
                or (attempts is not None and failures >= attempts)
                or (deadline is not None and clock() + delay > deadline)
            )
            if on_failure is not None:
                on_failure(error, failures, None if final else delay)
            if final:
                raise error
            sleep(delay)
        try:
            return call()
        except Exception as e:
            error = e
