"""Stalls on a real broker, the Kafka sink's runner in this process (docs/guarantees.md: no-silent-stall): a
partition with input waiting that does not move is named in a WARNING and counted in pipeline_stalled_partitions
while the others run on, and said to move again once it does. Two real ways for one partition to stall:
- an upstream transaction left open: the read_committed consumer gets nothing of p past its first record (the last
  stable offset stays there) while the high watermark grows;
- a fetcher that stops fetching p without the runner knowing (here: librdkafka's pause of p, called from the test):
  the cached high watermark stays where the last fetch left it, p looks caught up, and only the broker's end offset
  shows the records waiting.
tests/postgres/test_pg_stall.py runs the first through the PostgreSQL sink's runner."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition

from pipeline import settings
from pipeline.core.loop import PollLoop
from pipeline.examples.copier import app as copier
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing import inputs
from tests.integration.test_restore import running
from tests.support import eventually

STALL_WARNING_MS = 2_000  # short, for the test; 1.5-3 min stalls were seen with nothing said (the default is 30 s)


def produce_to(bootstrap: str, topic: str, p: int, n: int, start: int = 0) -> None:
    records = [(p, b"account-1", b'{"id": %d, "amount": 1}' % i) for i in range(start, start + n)]
    inputs.produce(bootstrap, topic, records, partitions=2)


def hang_a_transaction(bootstrap: str, topic: str, p: int) -> Producer:
    """An upstream producer whose transaction stays open: read_committed consumers get nothing of p from its record
    on until it ends (the last stable offset stays at that record)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"hung-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 300_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b'{"id": -1, "amount": 1}', b"account-1", partition=p)
    producer.flush(30)
    return producer


def stalled(runner: PollLoop) -> float | None:
    return runner.metrics.registry.get_sample_value("pipeline_stalled_partitions")


def stall_warnings(caplog: pytest.LogCaptureFixture, p: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"p{p} stalled")
    ]


def positions(runner: PollLoop) -> dict[int, int | None]:
    return {p: task.next_offset for p, task in runner._owned_partitions().items()}


def config(bootstrap: str, new_topic, **overrides) -> settings.Settings:  # type: ignore[no-untyped-def]
    return settings.load(
        env={},
        bootstrap_servers=bootstrap,
        app_id=f"stall-{uuid.uuid4().hex[:8]}",
        input_topic=new_topic("in", partitions=2),
        output_topic=new_topic("out", partitions=2),
        stall_warning_ms=STALL_WARNING_MS,
        **overrides,
    )


def held_back_by_an_open_transaction(runner: PollLoop, bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both sinks: p1 stalls behind an open transaction while p0 runs on; it moves again once the transaction ends."""
    topic = runner.settings.input_topic
    produce_to(bootstrap, topic, 0, 5)
    produce_to(bootstrap, topic, 1, 5)
    with running(runner):  # type: ignore[arg-type]
        eventually(lambda: positions(runner) == {0: 5, 1: 5}, 60)
        hung = hang_a_transaction(bootstrap, topic, 1)  # offset 5 of p1
        produce_to(bootstrap, topic, 1, 3, start=5)  # 6-8: committed, held back behind it
        eventually(lambda: runner.stall.stalled == [1] and stalled(runner) == 1, 60)
        warning = stall_warnings(caplog, 1)[0]
        assert "p1 stalled: RUNNING, no progress for" in warning
        assert f"{topic}[position 5, consumer at 5, high watermark " in warning
        assert "; not paused; assigned in the consumer" in warning
        # A period later the broker's last stable offset is known: it names the cause.
        diagnosed = "the broker's last stable offset 5: an open transaction upstream holds p's records back"
        eventually(lambda: any(diagnosed in w for w in stall_warnings(caplog, 1)), 60)

        produce_to(bootstrap, topic, 0, 3, start=5)
        eventually(lambda: positions(runner)[0] == 8, 60)  # p0 runs on meanwhile
        assert runner.stall.stalled == [1]

        hung.commit_transaction(30)
        eventually(lambda: positions(runner)[1] == 9 and stalled(runner) == 0, 60)
    assert "p1 moves again after" in caplog.text


def test_a_partition_held_back_by_an_open_transaction_upstream_is_reported(kafka_bootstrap, new_topic, caplog):
    caplog.set_level(logging.INFO, "pipeline")
    runner = KafkaRunner(copier, config(kafka_bootstrap, new_topic))
    held_back_by_an_open_transaction(runner, kafka_bootstrap, caplog)


def test_a_partition_the_fetcher_left_behind_is_reported_though_it_looks_caught_up(kafka_bootstrap, new_topic, caplog):
    caplog.set_level(logging.INFO, "pipeline")
    runner = KafkaRunner(copier, config(kafka_bootstrap, new_topic))
    topic = runner.settings.input_topic
    produce_to(kafka_bootstrap, topic, 0, 5)
    produce_to(kafka_bootstrap, topic, 1, 5)
    with running(runner):
        eventually(lambda: positions(runner) == {0: 5, 1: 5}, 60)
        runner.input.pause([TopicPartition(topic, 1)])  # behind the runner's back: its bookkeeping says not paused
        produce_to(kafka_bootstrap, topic, 1, 3, start=5)
        eventually(lambda: runner.stall.stalled == [1] and stalled(runner) == 1, 60)
        warning = stall_warnings(caplog, 1)[0]
        assert f"{topic}[position 5, consumer at 5, high watermark 5, the broker's last stable offset 8" in warning
        assert (
            "the cached high watermark is out of date: p is not being fetched" in warning and "; not paused;" in warning
        )
        assert runner.metrics.registry.get_sample_value("pipeline_consumer_lag", {"partition": "1"}) == 0, (
            "the lag gauge, from the cached watermark, says p1 is caught up: why the watchdog asks the broker"
        )

        runner.input.resume([TopicPartition(topic, 1)])
        eventually(lambda: positions(runner)[1] == 8 and stalled(runner) == 0, 60)
    assert "p1 moves again after" in caplog.text
