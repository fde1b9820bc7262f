"""What every runner shares: subscribe with rebalance callbacks, poll until stopped (SIGTERM/SIGINT), shut down
cleanly, and serve /metrics and /ready while running. Runners supply open(), _loop_once(), the rebalance callbacks,
is_ready() and _shutdown()."""

from __future__ import annotations

import signal
import threading

from confluent_kafka import Consumer, TopicPartition

from pipeline.metrics import HealthServer, Metrics
from pipeline.settings import Settings


class PollLoop:
    consumer: Consumer | None
    input_topic: str

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.consumer = None
        self._stop = threading.Event()

    def run(self) -> None:
        self.open()
        port = self.settings.metrics_port
        health = HealthServer(self.metrics, self.is_ready, port).start() if port else None
        self.consumer.subscribe([self.input_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
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

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        raise NotImplementedError

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        raise NotImplementedError
