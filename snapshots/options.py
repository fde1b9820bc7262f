"""What one compaction run is told (`Options`), the configuration of its Kafka clients, and its error."""

from __future__ import annotations

import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.redaction import secret_if_named
from pipeline.settings import SPARK_KAFKA_ENV_PREFIX, ConfigError
from pipeline.state.changelog import changelog_topic
from pipeline.state.snapshot_format import DEFAULT_CHUNK_BYTES, snapshot_topic

# Property names that hold a credential: refused on the command line. Not "key": ssl.key.location is a path.
COMMAND_LINE_SECRETS = ("password", "secret", "jaas", "token", "oauthbearer", "user.info", "credentials")

__all__ = ["SPARK_KAFKA_ENV_PREFIX", "CompactionError", "Options", "command_line_properties", "spark_kafka_properties"]


def command_line_properties(option: str, pairs: Iterable[str]) -> dict[str, str]:
    """KEY=VALUE options; a credential among them is refused (naming its key only: the value is the secret)."""
    properties: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ConfigError(f"{option}: KEY=VALUE expected, not {key!r}{'=...' if equals else ''}")
        if any(word in key.lower() for word in COMMAND_LINE_SECRETS):
            where = "PIPELINE_KAFKA_*" if option == "--kafka" else f"{SPARK_KAFKA_ENV_PREFIX}* or --spark-kafka-config"
            raise ConfigError(
                f"{option} {key}=...: a secret on the command line is visible to every local user (ps); give it "
                f"in the environment or a file instead ({where})"
            )
        properties[key] = value
    return properties


def spark_kafka_properties(env: Mapping[str, str], config_file: str | None) -> dict[str, str]:
    """Spark's Kafka source's Java client properties: PIPELINE_SPARK_KAFKA_SASL_JAAS_CONFIG -> sasl.jaas.config,
    then those of `config_file` (key=value lines), which must be readable by its owner only."""
    properties = {
        key[len(SPARK_KAFKA_ENV_PREFIX) :].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(SPARK_KAFKA_ENV_PREFIX)
    }
    if config_file:
        from pipeline.kafka.acls import read_properties

        path = Path(config_file)
        try:
            mode = path.stat().st_mode
        except OSError as e:
            raise ConfigError(f"--spark-kafka-config {path}: {e.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"--spark-kafka-config {path}: readable by others (mode {mode & 0o777:o}); chmod 600 it")
        properties |= read_properties(path, "--spark-kafka-config")
    return {key: secret_if_named(key, value) for key, value in properties.items()}


class CompactionError(RuntimeError):
    """The run cannot go on (no metadata, no changelog, a publisher that cannot start, ...): nothing was published."""


@dataclass(frozen=True)
class Options:
    bootstrap_servers: str
    app_id: str
    changelog_topic: str = ""
    snapshot_topic: str = ""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    truncate: bool = True  # delete below the previous generation after publishing
    timeout_s: float = 60.0
    kafka: dict[str, str] = field(default_factory=dict)  # extra librdkafka properties (driver and chunk producers)
    spark_kafka: dict[str, str] = field(default_factory=dict)  # extra Java client properties for Spark's source

    @property
    def changelog(self) -> str:
        return self.changelog_topic or changelog_topic(self.app_id)

    @property
    def snapshots(self) -> str:
        return self.snapshot_topic or snapshot_topic(self.app_id)

    @property
    def publisher_id(self) -> str:
        """Stable per app: a second run's init_transactions fences the first one's publisher."""
        return f"{self.app_id}.snapshot-publisher"

    def client(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}

    def consumer_config(self) -> dict[str, Any]:
        """The driver's consumer, which reads manifests (never offsets of its own group)."""
        return {
            **self.client(),
            "group.id": f"{self.app_id}.compaction",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }

    def chunk_producer_config(self) -> dict[str, Any]:
        """The executors' chunk producers: idempotent, not transactional (chunks are nothing until a manifest)."""
        return {
            **self.client(),
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "message.timeout.ms": int(self.timeout_s * 1000),
        }

    @property
    def chunk_flush_timeout_s(self) -> float:
        """Long enough for every chunk to be delivered or to have failed (message.timeout.ms)."""
        return self.timeout_s + 5

    def publisher_config(self) -> dict[str, Any]:
        """The driver's transactional producer, which publishes every partition's manifest in one transaction."""
        return {
            **self.client(),
            "transactional.id": self.publisher_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": int(max(self.timeout_s, 10) * 1000),
        }
