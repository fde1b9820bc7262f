"""Proofs that Spark reads Kafka through the real connector with read_committed (each fails against a fake)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyspark
import pytest
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from snapshots.spark_session import kafka_connector_jars
from tests.support import eventually

pytestmark = pytest.mark.spark

PARTITIONS = 2


def produce_transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % PARTITIONS)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # the aborted records reach the log, so read_committed has to skip them
        producer.abort_transaction(30)


def high_watermarks(admin: AdminClient, topic: str) -> dict[int, int]:
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    futures = admin.list_offsets(specs, isolation_level=IsolationLevel.READ_UNCOMMITTED)
    return {tp.partition: future.result(timeout=30).offset for tp, future in futures.items()}


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): offset for p, offset in offsets.items()}})


def spark_read(spark, bootstrap: str, topic: str, ends: dict[int, int], isolation: str) -> dict[int, list[bytes]]:
    """Batch-reads [0, ends) of every partition; returns the values per partition in offset order."""
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", isolation)
        .option("startingOffsets", offsets_json(topic, dict.fromkeys(ends, 0)))
        .option("endingOffsets", offsets_json(topic, ends))
        .option("failOnDataLoss", "true")
        .load()
        .select("partition", "offset", "value")
        .collect()
    )
    by_partition: dict[int, list[bytes]] = {p: [] for p in ends}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        by_partition[row.partition].append(bytes(row.value))
    return by_partition


def in_log_order(*transactions: list[bytes]) -> dict[int, list[bytes]]:
    """What each partition holds, in offset order, after producing the transactions one after another."""
    return {p: [value for values in transactions for value in values[p::PARTITIONS]] for p in range(PARTITIONS)}


def test_the_connector_and_its_token_provider_are_built_for_the_installed_pyspark():
    names = {Path(jar).name for jar in kafka_connector_jars().split(",")}
    spark = pyspark.__version__
    assert f"spark-sql-kafka-0-10_2.13-{spark}.jar" in names, names
    assert f"spark-token-provider-kafka-0-10_2.13-{spark}.jar" in names, names
    assert not any(name.startswith("spark-") and spark not in name for name in names), names


def test_spark_batch_read_committed_returns_exactly_the_committed_records(spark, kafka_bootstrap, new_topic):
    topic = new_topic("spark", partitions=PARTITIONS)
    before = [f"committed-{i}".encode() for i in range(6)]
    aborted = [f"aborted-{i}".encode() for i in range(6)]
    after = [f"committed-{i}".encode() for i in range(6, 12)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"spark-test-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    produce_transaction(producer, topic, before, commit=True)
    produce_transaction(producer, topic, aborted, commit=False)
    produce_transaction(producer, topic, after, commit=True)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # 3 records + 1 transaction marker per partition and transaction. commit_transaction returns once the coordinator
    # has decided; it writes the markers to the partitions after that (a CI run read 11 at once).
    expected = dict.fromkeys(range(PARTITIONS), 12)
    ends = eventually(lambda: (found := high_watermarks(admin, topic)) == expected and found, 30, 0.2)

    committed = spark_read(spark, kafka_bootstrap, topic, ends, "read_committed")
    assert committed == in_log_order(before, after)

    # The aborted records are really in the log: only the isolation level keeps them out.
    uncommitted = spark_read(spark, kafka_bootstrap, topic, ends, "read_uncommitted")
    assert uncommitted == in_log_order(before, aborted, after)
