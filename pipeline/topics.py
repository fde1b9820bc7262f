"""Topic checks at start-up: input and output must exist; internal topics are created with the input's partitions."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.settings import ConfigError

# The changelog is the only copy of the state until full snapshots exist: never delete from it by time.
CHANGELOG_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
# Full snapshots: never deleted by time either. The compaction job deletes (delete_records) below the previous
# generation once a new one is published, so the latest two complete generations always remain (snapshots/).
SNAPSHOT_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def partition_counts(admin: AdminClient, timeout_s: float) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise ConfigError(f"BOOTSTRAP_SERVERS: no cluster metadata within {timeout_s:.0f}s ({e.args[0]})") from e
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


def ensure_topics(
    admin: AdminClient,
    *,
    input_topic: str,
    output_topic: str,
    internal: dict[str, dict[str, str]],
    replication_factor: int,
    timeout_s: float,
) -> int:
    """Checks input/output, creates missing internal topics; returns the input's partition count."""
    counts = partition_counts(admin, timeout_s)
    for setting, topic in (("INPUT_TOPIC", input_topic), ("OUTPUT_TOPIC", output_topic)):
        if topic not in counts:
            raise ConfigError(f"{setting}: topic {topic!r} does not exist (create it: pipeline topics create ...)")
    partitions = counts[input_topic]
    missing = [
        NewTopic(name, partitions, replication_factor, config=config)
        for name, config in internal.items()
        if name not in counts
    ]
    if missing:
        for name, future in admin.create_topics(missing, request_timeout=timeout_s).items():
            try:
                future.result(timeout_s)
            except KafkaException as e:
                if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:  # another instance won the race
                    raise ConfigError(f"cannot create internal topic {name!r}: {e.args[0]}") from e
    for name in internal:
        if name in counts and counts[name] != partitions:
            raise ConfigError(
                f"topic {name!r} has {counts[name]} partitions but INPUT_TOPIC {input_topic!r} has {partitions}: "
                "partition p of both must belong together; recreate it with the input's partition count"
            )
    return partitions
