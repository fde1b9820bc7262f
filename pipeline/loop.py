"""What every runner shares: subscribe with rebalance callbacks, poll until stopped (SIGTERM/SIGINT), shut down
cleanly, and serve /metrics and /ready while running. Runners supply open(), _loop_once(), the rebalance callbacks,
is_ready() and _shutdown()."""

from __future__ import annotations

import logging
import signal
import threading
from collections import defaultdict

from confluent_kafka import Consumer, Message, TopicPartition

from pipeline.metrics import HealthServer, Metrics
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class FatalRunnerError(RuntimeError):
    """The process cannot go on (e.g. a partition cannot be fenced within the time-outs)."""


class PollLoop:
    consumer: Consumer | None
    input_topic: str
    # On a lost partition (membership expired): the Kafka runner must not commit (someone else may own it);
    # the PostgreSQL runner may try, because its epoch check decides.
    commit_on_lost = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.consumer = None
        self._stop = threading.Event()

    def run(self) -> None:
        self.open()
        port = self.settings.metrics_port
        health = HealthServer(self.metrics, self.is_ready, port).start() if port else None
        self.consumer.subscribe([self.input_topic], on_assign=self._assigned, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        try:
            while not self._stop.is_set():
                self._loop_once()
        finally:
            self._shutdown()
            if health:
                health.stop()

    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _by_partition(self, messages: list[Message]) -> dict[int, list[Message]]:
        """Consumed records grouped by input partition, in order; a fatal consumer error ends the process."""
        batches: dict[int, list[Message]] = defaultdict(list)
        for m in messages:
            if m.error():
                if m.error().fatal():
                    raise FatalRunnerError(f"consumer: {m.error()}")
                log.warning("consumer: %s", m.error())
                continue
            batches[m.partition()].append(m)
        return batches

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
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
        what = "committing what is open only if our epoch still holds" if self.commit_on_lost else \
            "aborting what is open, committing nothing"
        log.warning("lost %s (membership expired): %s", [tp.partition for tp in partitions], what)
        self.metrics.lost.inc(len(partitions))
        for tp in partitions:
            self._close_partition(tp.partition, commit=self.commit_on_lost)
        self.metrics.assigned.set(self._owned())

    # -- supplied by each runner -------------------------------------------------------------------------------------
    def open(self) -> None:
        raise NotImplementedError

    def is_ready(self) -> bool:
        raise NotImplementedError

    def _loop_once(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        raise NotImplementedError

    def _close_partition(self, p: int, commit: bool) -> None:
        raise NotImplementedError

    def _owned(self) -> int:
        raise NotImplementedError
