"""The blocking steps of taking partitions over in the Kafka sink, each bounded and retried while the cluster moves:
the topics checked (and the internal ones created) at start-up, the fence, the group's committed offsets. The
runner (pipeline/sinks/kafka/runner.py: `KafkaRunner._take_over`) calls them in this order: fence, then offsets,
then assign, then restore (docs/guarantees.md: fence-first)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.core.loop import FatalRunnerError
from pipeline.kafka.acls import Names
from pipeline.kafka.errors import kafka_error
from pipeline.kafka.permissions import AFTER_TOPICS, BEFORE_TOPICS, check_service, missing_transactional_id
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG, ensure_topics
from pipeline.retry import Backoff, retry
from pipeline.settings import Settings
from pipeline.sinks.kafka.transaction import Transaction

log = logging.getLogger(__name__)
# While the transaction or group coordinator moves (a broker restarting): asked again this often.
COORDINATOR_BACKOFF = Backoff(0.5, factor=1)


def prepare_topics(admin: AdminClient, names: Names, settings: Settings, stateful: bool) -> None:
    """The service's permissions, its input and output topics, and its internal topics (created when missing):
    a clear error naming what is wrong before anything is consumed."""
    internal: dict[str, dict[str, str]] = {names.dead_letter_topic: {}}
    if stateful:
        internal[names.changelog_topic] = CHANGELOG_CONFIG
        internal[names.snapshot_topic] = SNAPSHOT_CONFIG
    check_service(admin, names, settings, stateful=stateful, phase=BEFORE_TOPICS)
    ensure_topics(
        admin,
        input_topic=names.input_topic,
        output_topic=names.output_topic,
        internal=internal,
        replication_factor=settings.topic_replication_factor,
        timeout_s=settings.request_timeout_ms / 1000,
    )
    check_service(admin, names, settings, stateful=stateful, phase=AFTER_TOPICS)


def fence(txns: list[Transaction], settings: Settings) -> None:
    """init_transactions on every transaction's producer, in parallel, each retried for 3 request time-outs;
    FatalRunnerError naming the ones that could not be fenced. A missing transactional-id permission is named at
    once (MissingPermission)."""
    if not txns:
        return
    with ThreadPoolExecutor(len(txns)) as pool:
        results = list(pool.map(_fence_one, txns, [settings] * len(txns)))
    failed = [f"{t.name}: {r}" for t, r in zip(txns, results, strict=True) if r]
    if failed:
        raise FatalRunnerError("cannot fence " + "; ".join(failed) + " (is the transaction coordinator up?)")


def _fence_one(txn: Transaction, settings: Settings) -> str | None:
    """The last error, or None once fenced."""

    def failed(error: Exception, failures: int, delay: float | None) -> None:
        if (known := kafka_error(error)) is not None and (missing := missing_transactional_id(known, txn.name)):
            raise missing from error
        if delay is not None:
            log.warning("%s: init_transactions: %s; retrying", txn.name, known)

    try:
        retry(
            txn.fence,
            retriable=_not_fatal,
            backoff=COORDINATOR_BACKOFF,
            within_s=3 * settings.request_timeout_ms / 1000,
            on_failure=failed,
        )
    except KafkaException as e:
        return str(e.args[0])
    return None


def committed_offsets(
    consumer: Consumer, topic: str, partitions: list[int], settings: Settings
) -> dict[int, int | None]:
    """The group's committed offsets, retried while the coordinator moves (bounded: 3 request time-outs). They are
    read stable (read_committed makes librdkafka ask with require_stable): while a previous owner's transaction
    holding offsets of p is open, the broker answers UNSTABLE_OFFSET_COMMIT and librdkafka asks again, so the wait
    lasts until that transaction ends, at most TRANSACTION_TIMEOUT_MS (docs/guarantees.md: zombies-stay-out)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    timeout_s = settings.request_timeout_ms / 1000

    def failed(error: Exception, failures: int, delay: float | None) -> None:
        if delay is not None:
            log.warning("committed offsets of %s: %s; retrying", partitions, kafka_error(error))

    try:
        result = retry(
            lambda: consumer.committed(tps, timeout=timeout_s),
            retriable=_not_fatal,
            backoff=COORDINATOR_BACKOFF,
            within_s=max(3 * timeout_s, settings.transaction_timeout_ms / 1000 + timeout_s),
            on_failure=failed,
        )
    except KafkaException as e:
        raise FatalRunnerError(f"committed offsets of {partitions} not readable: {e.args[0]}") from e
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}


def _not_fatal(error: Exception) -> bool:
    known = kafka_error(error)
    return isinstance(error, KafkaException) and not (known is not None and known.fatal())
