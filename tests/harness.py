"""The Kafka sink's pieces wired to the fakes of tests/fakes.py, for the broker-free tests: a KafkaTask with its
transaction (`Harness`), a KafkaRunner (`kafka_runner`), and the records they process (`msg`, `poison`).

The fakes are the Kafka clients; this is how the runtime is put together around them, so it lives apart from them
(tests/fakes.py imports nothing of the runtime)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Message

from pipeline import settings as settings_module
from pipeline.app import App
from pipeline.core.lifecycle import Phase
from pipeline.examples.running_totals import app as running_totals
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.kafka.commit import close_task, commit_transaction
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask, KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction, transactional_id
from tests.fakes import Calls, FakeConsumer, FakeProducer, kafka_message

APP_ID = "unit"
INPUT, OUTPUT, CHANGELOG, DLQ = "in", "out", "unit-changelog", "unit-dlq"
P = 2


def msg(offset: int, amount: int = 1, account: str = "acct") -> Message:
    """An input record of running_totals on partition P."""
    return kafka_message(offset, account.encode(), orjson.dumps({"id": f"id-{offset}", "amount": amount}), partition=P)


def poison(offset: int) -> Message:
    """A record running_totals cannot read."""
    return kafka_message(offset, b"acct", b"{not json", partition=P)


class Harness:
    """KafkaTasks of partition P (or any) on a FakeConsumer and FakeProducers that share one Calls, so that the order
    of every call is one list; the runner's commit and close as the runner calls them."""

    def __init__(self, app: App = running_totals, abort_hook: Callable[[int], bool] | None = None, **settings: Any):
        self.calls = Calls()
        self.producers: list[FakeProducer] = []
        self.consumer = FakeConsumer(self.calls)
        self.metrics = Metrics()
        self.settings = Settings(**{"processing_backoff_ms": 0, "request_timeout_ms": 1_000, **settings})
        self.abort_hook = abort_hook
        self.ctx = KafkaTaskContext(
            app=app,
            settings=self.settings,
            app_id=APP_ID,
            input_topic=INPUT,
            output_topic=OUTPUT,
            changelog_topic=CHANGELOG,
            dead_letter_topic=DLQ,
            consumer=self.consumer,  # type: ignore[arg-type]
            metrics=self.metrics,
        )

    def _make_producer(self, tid: str | None) -> FakeProducer:
        producer = FakeProducer(self.calls, tid)
        self.producers.append(producer)
        return producer

    def transaction(self, p: int = P) -> Transaction:
        """As the runner builds it with PRODUCERS=per_partition: a producer named after p."""
        tid = transactional_id(APP_ID, INPUT, p) if self.settings.exactly_once else None
        make = lambda: self._make_producer(tid)  # noqa: E731
        observe = self.metrics.commit_latency.observe
        return Transaction(make(), self.settings, f"p{p}", self.abort_hook, observe, renew_with=make)  # type: ignore[arg-type]

    def new_task(self, p: int = P) -> KafkaTask:
        return KafkaTask(self.ctx, p, self.transaction(p))

    def commit(self, task: KafkaTask) -> None:
        """What the runner does when p's transaction is due."""
        commit_transaction(task.txn, self.consumer)  # type: ignore[arg-type]

    def close(self, task: KafkaTask, commit: bool) -> None:
        close_task(task, self.consumer, commit)  # type: ignore[arg-type]

    def task(self, committed: int | None = 0) -> KafkaTask:
        """A task fenced, started at `committed` and (no changelog here) restored."""
        task = self.new_task()
        task.txn.fence()
        task.start(committed)
        task.phase = Phase.RUNNING  # restore is pipeline/state/restore.py's business
        self.calls.clear()
        return task

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def kafka_runner(app: App, consumer: Any, make_producer: Callable[[str | None], Any], **settings: Any) -> KafkaRunner:
    """A KafkaRunner on fake clients that never connects: `consumer` is its group consumer, `make_producer(
    transactional_id)` makes its producers; changelog "cl", dead letters "dlq". `settings` as for settings.load."""
    runner = KafkaRunner(app, settings_module.load(env={}, bootstrap_servers="unused:9092", **settings))
    runner.consumer = consumer
    runner._make_producer = lambda txn_id, on_delivery=None: make_producer(txn_id)  # type: ignore[method-assign,assignment,misc]
    new_transaction = runner._new_transaction

    def without_quick_fence(txn_id: str, name: str | None = None) -> Transaction:
        txn = new_transaction(txn_id, name)
        txn._quick_fence = None  # a kafka-python client of its own: it would try to reach the broker for seconds
        return txn

    runner._new_transaction = without_quick_fence  # type: ignore[method-assign]
    runner.ctx = KafkaTaskContext(
        app,
        runner.settings,
        runner.app_id,
        app.input_topic,
        app.output_topic,
        "cl",
        "dlq",
        consumer,
        runner.metrics,
    )
    return runner
