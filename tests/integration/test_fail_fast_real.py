"""Mistakes stop a partition loudly on a real broker (docs/guarantees.md: fail-fast), the Kafka sink's runner in this
process: ON_POISON=stop on a partition's very first record. tests/postgres/test_pg_fail_fast.py runs the same
cases through the PostgreSQL sink's runner."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Producer

from pipeline import settings
from pipeline.app import App
from pipeline.core.loop import PollLoop
from pipeline.examples.running_totals import app as totals
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing import inputs
from tests.integration.test_restore import running
from tests.support import eventually


def topics_with(bootstrap: str, records: list[tuple[bytes, bytes]]) -> tuple[str, str, str]:
    """A fresh one-partition input holding `records`, an output topic, and an app id."""
    suffix = uuid.uuid4().hex[:8]
    app_id, input_topic, output_topic = f"ff-{suffix}", f"ff-in-{suffix}", f"ff-out-{suffix}"
    inputs.create_topics(bootstrap, {input_topic: 1, output_topic: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(input_topic, value, key, partition=0)
    producer.flush(10)
    return app_id, input_topic, output_topic


def config(bootstrap: str, app_id: str, input_topic: str, output_topic: str, **overrides: Any) -> settings.Settings:
    return settings.load(
        env={},
        bootstrap_servers=bootstrap,
        app_id=app_id,
        input_topic=input_topic,
        output_topic=output_topic,
        processing_backoff_ms=0,
        **overrides,
    )


def stopped(runner: PollLoop) -> bool:
    task = runner._owned_partitions().get(0)
    return task is not None and task.phase.value == "stopped"


def kafka_runner(app: App, bootstrap: str, records: list[tuple[bytes, bytes]], **overrides: Any) -> KafkaRunner:
    app_id, input_topic, output_topic = topics_with(bootstrap, records)
    return KafkaRunner(app, config(bootstrap, app_id, input_topic, output_topic, **overrides))


def test_on_poison_stop_on_the_first_record_of_a_partition_stops_it(kafka_bootstrap: str) -> None:
    runner = kafka_runner(totals, kafka_bootstrap, [(b"acct", b"{bad")], on_poison="stop")
    with running(runner):
        eventually(lambda: stopped(runner), 30)
