"""Mistakes stop a partition loudly on a real broker (docs/guarantees.md: fail-fast), the Kafka sink's runner in this
process: a mistake in the code (process returning None) stops the partition at once and ends the process; so does a
dead-letter storm; and ON_POISON=stop on a partition's very first record. tests/postgres/test_pg_fail_fast.py runs
the same cases through the PostgreSQL sink's runner."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

import pytest
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


def returns_none(state: Any, record: Any) -> None:
    return None


def raises_key_error(state: Any, record: Any) -> None:
    raise KeyError("no such account")


GOOD = (b"acct", b'{"id": "1", "amount": 5}')


def assert_stopped_loudly(runner: PollLoop, caplog: pytest.LogCaptureFixture, *said: str) -> None:
    """The runner ended by itself (every partition stopped), with the ERROR, the gauge and /ready at 0."""
    eventually(lambda: runner.all_stopped and not runner._owned_partitions(), 30)  # the loop ended, shut down
    errors = "\n".join(r.message for r in caplog.records if r.levelno == logging.ERROR)
    assert "p0: STOPPED at " in errors and all(s in errors for s in said), errors
    assert "every partition of this process stopped" in errors
    samples = runner.metrics.registry.get_sample_value
    assert samples("pipeline_stopped_partitions") == 1 and samples("pipeline_ready") == 0


def kafka_runner(app: App, bootstrap: str, records: list[tuple[bytes, bytes]], **overrides: Any) -> KafkaRunner:
    app_id, input_topic, output_topic = topics_with(bootstrap, records)
    return KafkaRunner(app, config(bootstrap, app_id, input_topic, output_topic, **overrides))


def test_on_poison_stop_on_the_first_record_of_a_partition_stops_it(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    runner = kafka_runner(totals, kafka_bootstrap, [(b"acct", b"{bad")], on_poison="stop", processing_max_attempts=1)
    with running(runner):
        assert_stopped_loudly(runner, caplog, "@0 failed 1 times: SerdeError")


def test_a_mistake_in_process_stops_the_partition_at_once_and_ends_the_runner(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = dataclasses.replace(totals, process=returns_none)
    runner = kafka_runner(app, kafka_bootstrap, [GOOD, GOOD], processing_max_attempts=5)
    with running(runner):
        assert_stopped_loudly(runner, caplog, "process returned None", "[0]@0", "return a list of Output")


def test_a_dead_letter_storm_stops_the_partition_and_ends_the_runner(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = dataclasses.replace(totals, process=raises_key_error)
    runner = kafka_runner(app, kafka_bootstrap, [GOOD] * 5, dead_letter_storm=3, processing_max_attempts=1)
    with running(runner):
        assert_stopped_loudly(runner, caplog, "dead-letter storm: 3 records in a row failed with KeyError", "@2")
