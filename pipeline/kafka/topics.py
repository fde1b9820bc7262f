"""Topic checks at start-up: input and output must exist; internal topics are created with the input's partitions."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic, TopicMetadata

from pipeline.retry import Backoff, retry
from pipeline.settings import ConfigError

# The changelog is the only copy of the state until full snapshots exist: never delete from it by time.
CHANGELOG_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
# Full snapshots: never deleted by time either. The compaction job deletes (delete_records) below the previous
# generation once a new one is published, so the latest two complete generations always remain (snapshots/).
SNAPSHOT_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def partition_counts(admin: AdminClient, timeout_s: float, needed: Iterable[str] = ()) -> dict[str, int]:
    """Partition count of every topic whose metadata is complete. A `needed` topic that exists but has no leader
    yet (just created, broker starting) is asked again until timeout_s rather than reported as missing."""
    deadline = time.monotonic() + timeout_s

    def ask() -> ClusterMetadata:
        metadata = admin.list_topics(timeout=max(deadline - time.monotonic(), 0.5))
        if any(_still_settling(metadata.topics.get(name)) for name in needed):
            raise _Settling(metadata)
        return metadata

    try:
        metadata = retry(
            ask, retriable=lambda e: isinstance(e, _Settling), backoff=Backoff(0.2, 1.0), within_s=timeout_s
        )
    except _Settling as settling:  # the time is up: what is known
        metadata = settling.metadata
    except KafkaException as e:
        raise ConfigError(f"BOOTSTRAP_SERVERS: no cluster metadata within {timeout_s:.0f}s ({e.args[0]})") from e
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


class _Settling(Exception):
    """A needed topic exists but has no leader yet: asked again."""

    def __init__(self, metadata: ClusterMetadata) -> None:
        super().__init__("topic metadata still settling")
        self.metadata = metadata


def _still_settling(topic: TopicMetadata | None) -> bool:
    if topic is None:
        return False
    if topic.error is not None:
        return topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
    return any(p.error is not None and p.error.retriable() for p in topic.partitions.values())


def ensure_topics(
    admin: AdminClient,
    *,
    input_topic: str,
    output_topic: str,
    internal: dict[str, dict[str, str]],
    replication_factor: int,
    timeout_s: float,
    co_partitioned: Sequence[str] = (),
    global_tables: Sequence[str] = (),
    single: Mapping[str, dict[str, str]] | None = None,
) -> int:
    """Checks the inputs, tables and output, creates missing internal topics; returns the input's partition count.
    `co_partitioned`: the other topics a task reads partition p of (inputs, tables): they must have the first
    input's partition count, or the App cannot start. `single`: internal topics of one partition, not tied to the
    input's partitions (FAILURE_DETECTION_MS's heartbeats), created when missing."""
    single = single or {}
    counts = partition_counts(
        admin, timeout_s, needed=(input_topic, *co_partitioned, *global_tables, output_topic, *internal, *single)
    )
    partitions = require_inputs(counts, input_topic, co_partitioned, global_tables, output_topic)
    missing = [
        NewTopic(name, partitions, replication_factor, config=config)
        for name, config in internal.items()
        if name not in counts
    ]
    missing += [
        NewTopic(name, 1, replication_factor, config=config) for name, config in single.items() if name not in counts
    ]
    if missing:
        _create(admin, missing, timeout_s)
    for name in internal:
        if name in counts and counts[name] != partitions:
            raise ConfigError(
                f"topic {name!r} has {counts[name]} partitions but INPUT_TOPIC {input_topic!r} has {partitions}: "
                "partition p of both must belong together; recreate it with the input's partition count"
            )
    return partitions


def require_inputs(
    counts: Mapping[str, int],
    input_topic: str,
    co_partitioned: Sequence[str] = (),
    global_tables: Sequence[str] = (),
    output_topic: str = "",
) -> int:
    """ConfigError naming the setting for a topic the App reads (or writes, `output_topic`; "": none) that does not
    exist, and naming every count when the co-partitioned topics' partition counts differ; the input's count. Both
    sinks check so at start-up."""
    named = [("INPUT_TOPIC", input_topic), *(("the App's inputs and tables", t) for t in co_partitioned)]
    named += [("the App's global tables", t) for t in global_tables]
    named += [("OUTPUT_TOPIC", output_topic)] if output_topic else []
    for setting, topic in named:
        if topic not in counts:
            raise ConfigError(f"{setting}: topic {topic!r} does not exist (create it: pipeline topics create ...)")
    partitions = counts[input_topic]
    if unequal := {t: counts[t] for t in co_partitioned if counts[t] != partitions}:
        raise ConfigError(
            f"the App's inputs and tables are co-partitioned (a task reads partition p of each), so they need the "
            f"same partition count: {input_topic!r} has {partitions}, "
            + ", ".join(f"{t!r} has {n}" for t, n in unequal.items())
        )
    return partitions


def _create(admin: AdminClient, topics: list[NewTopic], timeout_s: float) -> None:
    """Creates the topics; a retriable failure (controller moving or still starting) is retried until timeout_s."""
    deadline = time.monotonic() + timeout_s
    pending = list(topics)

    def create() -> None:
        nonlocal pending
        futures = admin.create_topics(pending, request_timeout=max(deadline - time.monotonic(), 1.0))
        again: list[tuple[NewTopic, KafkaError]] = []
        for topic in pending:
            try:
                futures[topic.topic].result(timeout_s)
            except KafkaException as e:
                error = e.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # another instance won the race
                    continue
                if error.retriable() or error.code() == KafkaError._TIMED_OUT:
                    again.append((topic, error))
                    continue
                raise ConfigError(f"cannot create internal topic {topic.topic!r}: {error}") from e
        pending = [topic for topic, _ in again]
        if again:
            raise _NotCreatedYet(*again[0])

    try:
        retry(create, retriable=lambda e: isinstance(e, _NotCreatedYet), backoff=Backoff(0.5, 1.0), within_s=timeout_s)
    except _NotCreatedYet as e:
        raise ConfigError(f"cannot create internal topic {e.topic.topic!r}: {e.error}") from None


class _NotCreatedYet(Exception):
    """A retriable failure to create a topic (controller moving or still starting): tried again."""

    def __init__(self, topic: NewTopic, error: KafkaError) -> None:
        super().__init__(f"{topic.topic}: {error}")
        self.topic, self.error = topic, error
