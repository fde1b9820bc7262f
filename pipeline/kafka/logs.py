"""librdkafka's own log lines, through Python logging (the `pipeline.librdkafka` logger) and rate-limited.

Left to itself, librdkafka writes every line to stderr: a broker that does not answer is one `FAIL` line per client
per reconnect attempt, over a thousand in a minute for a command with a few clients. Given to a client as its
`logger` property, a `LibrdkafkaLog` receives those lines instead (confluent-kafka calls its `log` method from the
client's poll), lets the first of each kind through at librdkafka's level, then at most one per KAFKA_LOG_INTERVAL_MS,
and the next one let through says how many it stood for. A kind is the facility and the text with its numbers
blanked out, whichever client said it: forty producers failing to reach one broker are one line.

Only clients that are polled get it (consumers and producers, the start-up check): an admin client serves its log
queue only from poll(), which nothing calls, so its lines would pile up unseen; admin clients keep librdkafka's own
stderr logging.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable

LOGGER = logging.getLogger("pipeline.librdkafka")
_NUMBERS = re.compile(r"\d+")
_MAX_KINDS = 1_000  # kinds remembered; older ones are forgotten first (a kind forgotten is let through again)


class RateLimit:
    """Admits the first of a kind, then at most one per interval; admit() returns how many it held back before."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (when last admitted, held back since)
        self._lock = threading.Lock()  # clients log from the threads that poll them

    def admit(self, kind: str) -> int | None:
        """None: hold this one back; else the number held back since the last one admitted."""
        now = self._clock()
        with self._lock:
            last, held = self._seen.pop(kind, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._seen[kind] = (last, held + 1)
                return None
            self._seen[kind] = (now, 0)
            while len(self._seen) > _MAX_KINDS:
                del self._seen[next(iter(self._seen))]
            return held


class LibrdkafkaLog:
    """The `logger` of a librdkafka client: its lines go to `pipeline.librdkafka`, rate-limited. `demote_to` logs
    them at that level instead of theirs (the start-up check, which reports the last error itself)."""

    def __init__(self, interval_s: float, demote_to: int | None = None) -> None:
        self.limit = RateLimit(interval_s)
        self.demote_to = demote_to

    def log(self, level: int, fmt: str, *args: object) -> None:
        """Called by confluent-kafka as logger.log(level, "%s [%s] %s", facility, client name, text)."""
        facility, text = (str(args[0]), str(args[-1])) if len(args) == 3 else ("", fmt % args)
        held = self.limit.admit(f"{facility} {_NUMBERS.sub('#', text)}")
        if held is None:
            return
        level = level if self.demote_to is None else self.demote_to
        if held:
            LOGGER.log(level, fmt + " (%d more like it held back since the last one shown)", *args, held)
        else:
            LOGGER.log(level, fmt, *args)


@functools.cache
def librdkafka_log(interval_ms: int, demote_to: int | None = None) -> LibrdkafkaLog:
    """One per process and kind of use: every client's lines share one rate limit."""
    return LibrdkafkaLog(interval_ms / 1000, demote_to)
