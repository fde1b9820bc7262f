"""Settings: defaults < config file (TOML) < environment (`PIPELINE_<NAME>`) < explicit overrides.

Every setting is validated at start-up; a bad one fails with a message that names it. Any librdkafka property can
be passed through with `PIPELINE_KAFKA_<PROPERTY>` (dots as underscores, e.g. PIPELINE_KAFKA_SECURITY_PROTOCOL) or a
`[kafka]` table in the config file; it applies to every client the runner creates. Secrets (Kafka properties whose
name holds one of SECRET_WORDS, the PostgreSQL DSN) are `Secret` strings (pipeline/redaction.py): repr() shows
`'***'`, so printing or logging the settings, their `kafka` dict or `dataclasses.asdict(settings)` never shows
them, while the clients get the real value. json.dumps and str() do write the real value: what is serialised for a
log or a report is `settings.redacted()`.

A service with settings of its own extends the type; its fields are read from the same file and environment, with
the same checks and error messages (fields of type str, int or bool):

    from dataclasses import dataclass
    from pipeline.settings import ConfigError, Settings

    @dataclass(frozen=True)
    class PricingSettings(Settings):
        price_feed_url: str = "http://prices:8080"  # PIPELINE_PRICE_FEED_URL, or price_feed_url in the TOML file
        max_discount_percent: int = 30

        def __post_init__(self) -> None:
            super().__post_init__()  # the pipeline's own checks first
            if not 0 <= self.max_discount_percent <= 100:
                raise ConfigError(f"MAX_DISCOUNT_PERCENT must be 0..100, not {self.max_discount_percent}")

    settings = PricingSettings.load()  # or PricingSettings.load("pricing.toml", max_discount_percent=10)

Fields declared by a subclass are known to every loader, so `pipeline run` (which loads the base Settings after
importing the service's module) accepts PIPELINE_PRICE_FEED_URL instead of failing on an unknown setting.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline.redaction import REDACTED, Secret, as_secret, redact_dsn, secret_if_named

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
CLASSIC = "classic"  # the group protocol before KIP-848: the clients heartbeat, a client assigns
CONSUMER = "consumer"  # KIP-848 (Kafka 4.0+): the broker assigns, the group's session timeout is the broker's
PER_PARTITION = "per_partition"  # a transactional producer per input partition, fenced by its transactional.id
PER_PROCESS = "per_process"  # one per process (KIP-447), zombies fenced by the consumer group's generation
ENV_PREFIX = "PIPELINE_"
KAFKA_ENV_PREFIX = "PIPELINE_KAFKA_"
SPARK_KAFKA_ENV_PREFIX = "PIPELINE_SPARK_KAFKA_"  # the compaction job's Java client properties (snapshots/options.py)


class ConfigError(ValueError):
    """A setting is missing, malformed or contradicts another one. The message names the setting."""


def port_taken(host: str, port: int, error: OSError) -> ConfigError:
    """METRICS_PORT (or a worker's port derived from it) could not be listened on: a traceback of socketserver's
    bind was all a user got when another process had the port."""
    return ConfigError(
        f"METRICS_PORT: cannot listen on {host}:{port} ({error.strerror or error}): another process has the port? "
        "Choose a free METRICS_PORT, or 0 for no endpoint (with --workers N and QUERY_ENABLED, worker k also listens "
        "on METRICS_PORT + 1 + k)"
    )


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = "127.0.0.1:9092"
    app_id: str = ""  # default: the App's name; also the consumer group id and transactional.id prefix
    input_topic: str = ""  # default: the App's (a one-input App only)
    output_topic: str = ""  # default: the App's
    topic_suffix: str = ""  # appended to every topic the App names (inputs, tables, output): e.g. "-staging"
    dead_letter_topic: str = ""  # default: <app_id>-dlq
    changelog_topic: str = ""  # default: <app_id>-changelog
    snapshot_topic: str = ""  # default: <app_id>-snapshots (full snapshots, written by `snapshots compact`)
    snapshot_on_shutdown: bool = False  # on a clean stop, also publish each partition's state as a full snapshot
    processing_guarantee: str = EXACTLY_ONCE
    commit_interval_ms: int = 100
    commit_max_records: int = 10_000
    poll_max_records: int = 5_000
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 300_000
    transaction_timeout_ms: int = 10_000
    request_timeout_ms: int = 10_000  # bound on every blocking Kafka call (commit, end offsets, metadata)
    connect_timeout_ms: int = 10_000  # at start-up, every command: no broker answered by then is one clear error
    kafka_log_interval_ms: int = 10_000  # the same librdkafka log line at most once per this (0: every line)
    restore_step_ms: int = 200  # longest restore work between two polls of the main consumer
    restore_timeout_ms: int = 600_000  # give up restoring a partition after this long
    processing_max_attempts: int = 3
    processing_backoff_ms: int = 50
    on_poison: str = "dead_letter"  # or "stop": the partition stops with an error
    # The dead-letter storm guard (docs/guarantees.md: fail-fast): this many records in a row failing with the same
    # error type stop the partition (the last of them is not dead-lettered); 0: off.
    dead_letter_storm: int = 100
    timers_per_turn: int = 1_000  # due timers fired per partition per loop turn at most (a burst spreads over turns)
    # Several inputs (docs/inputs.md): how long a task waits for an empty input before it takes the others' records
    # alone, out of timestamp order with what that input may bring later; not at all for an input that is caught up
    # (nothing on the broker it has not fetched). -1: never wait.
    max_task_idle_ms: int = 100
    # Fast failure detection (pipeline/kafka/liveness.py): a peer silent this long is fenced and removed from the group
    # at once, instead of after SESSION_TIMEOUT_MS (and TRANSACTION_TIMEOUT_MS for its open transaction). 0: off.
    # On by default (issue 33): a take-over in ~2 s instead of ~11 s. 1000 ms is twice the bound that saw no false
    # positive in three soaks at load averages up to 14, and was itself soaked on a loaded machine (BENCHMARKS.md).
    failure_detection_ms: int = 1_000
    # Warm standbys (pipeline/state/standby.py): copies of this many other members' partitions kept here, following
    # their changelog, so that a take-over reads only what the copy is behind. 0: none (a take-over restores in full).
    standby_replicas: int = 0
    # /live answers 503 when the poll loop has not turned for this long. A healthy turn can block for a take-over's
    # fence (3 x REQUEST_TIMEOUT_MS) and its committed offsets (up to TRANSACTION_TIMEOUT_MS + REQUEST_TIMEOUT_MS).
    # 0: that longest healthy turn + 10 s (50 s + 10 s with the defaults).
    live_timeout_ms: int = 0
    # The stalled-partition watchdog (pipeline/core/stall.py): an owned partition, not stopped, with input waiting
    # (or a restore under way) that has not moved for this long gets a WARNING and counts in
    # pipeline_stalled_partitions. 0: off.
    stall_warning_ms: int = 30_000
    group_instance_id: str = ""  # static membership (e.g. the pod name); with per_process, the producer's name too
    # per_process: one transactional producer for the whole process (KIP-447); per_partition: one per input partition.
    # per_process by measurement: 14 threads at any partition count (per_partition ~5 per partition, 1,935 at 384),
    # half the memory at 384 partitions, equal throughput at 3 and 1.03-1.3x at 48-384 (BENCHMARKS.md).
    producers: str = PER_PROCESS
    group_protocol: str = CLASSIC  # or "consumer" (KIP-848): SESSION_TIMEOUT_MS and HEARTBEAT_INTERVAL_MS do not apply
    metrics_port: int = 0  # 0: no HTTP endpoint
    metrics_host: str = "0.0.0.0"  # the address it binds (e.g. 127.0.0.1, or a private network's, for queries)
    # Queries of committed state on METRICS_PORT (pipeline/core/queries.py: token, address, partitioner, wait).
    query_enabled: bool = False
    query_token: str = ""
    query_address: str = ""
    query_partitioner: str = "murmur2"
    query_wait_ms: int = 5_000
    topic_replication_factor: int = -1  # for internal topics; -1: the broker default
    test_abort_every: int = 0  # testing only: abort every k-th transaction of each partition (0: never)
    sink: str = "kafka"  # or "postgres": results and offsets in one database transaction (pipeline/postgres)
    postgres_dsn: str = ""  # libpq URI or key=value string (may hold a password: kept as a Secret)
    postgres_schema: str = "public"  # where the sink's tables live (created or migrated on start-up)
    postgres_pool_size: int = 4  # connections per process (one per partition committing at the same time)
    postgres_retry_backoff_max_ms: int = 5_000  # back-off cap while PostgreSQL is unreachable
    postgres_idle_in_transaction_timeout_ms: int = 5_000  # the server ends a writer paused mid-transaction
    # Avro, Protobuf and JSON Schema topics (pipeline/registry.py): the Confluent-compatible registry's URL (several:
    # comma-separated), its basic-auth credentials as user:password (a Secret), and how long one request may take.
    schema_registry_url: str = ""
    schema_registry_user_info: str = ""
    schema_registry_timeout_ms: int = 5_000
    # A partition's state (pipeline/state/disk_store.py): "memory" (a dict) or "disk" (RocksDB under STATE_DIR, the
    # [disk] extra), its memory bounded by a block cache and write buffers that all its partitions share.
    state_store: str = "memory"
    state_dir: str = ""
    state_block_cache_mb: int = 64
    state_write_buffer_mb: int = 32
    test_kill_before_state_write: int = 0  # testing only: SIGKILL before the n-th commit's disk batch (0: never)
    kafka: Mapping[str, str] = field(default_factory=dict)  # values of secret-looking names kept as Secrets

    def __post_init__(self) -> None:
        # Frozen: the secrets are wrapped in place, once, whoever built the settings (load, a test, a benchmark).
        kafka = {k: secret_if_named(k, v) for k, v in self.kafka.items()}
        object.__setattr__(self, "kafka", kafka)
        object.__setattr__(self, "postgres_dsn", as_secret(self.postgres_dsn))
        object.__setattr__(self, "schema_registry_user_info", as_secret(self.schema_registry_user_info))
        object.__setattr__(self, "query_token", as_secret(self.query_token))
        validate(self)
        validate_registry(self)
        _validate_queries(self)

    @classmethod
    def load(
        cls, config_file: str | Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any
    ) -> typing.Self:
        """Settings of this type from a TOML file, then the environment (os.environ if None), then keyword overrides
        (an override of None means "not given")."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        kafka: dict[str, str] = {}
        config_file = config_file or env.get(ENV_PREFIX + "CONFIG_FILE")
        if config_file:
            values, kafka = _from_toml(cls, Path(config_file))
        env_values, env_kafka = _from_env(cls, env)
        values |= env_values
        kafka |= env_kafka
        kafka |= overrides.pop("kafka", {})
        values |= {k: v for k, v in overrides.items() if v is not None}
        return cls(**values, kafka=kafka)

    def with_overrides(self, **overrides: Any) -> Settings:
        return dataclasses.replace(self, **overrides)

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == EXACTLY_ONCE

    def redacted_kafka(self) -> dict[str, str]:
        return {k: (REDACTED if isinstance(v, Secret) else v) for k, v in self.kafka.items()}

    def redacted(self) -> dict[str, Any]:
        """Every setting, JSON-ready, for logs and reports: no secret (json.dumps(asdict(settings)) writes them all,
        as str() does: a Secret is still the real string to everything but repr). The DSN keeps user, host and
        database, without its password."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        user_info = REDACTED if self.schema_registry_user_info else ""
        return values | {
            "query_token": REDACTED if self.query_token else "",
            "kafka": self.redacted_kafka(),
            "postgres_dsn": redact_dsn(self.postgres_dsn),
            "schema_registry_user_info": user_info,
        }


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(s: Settings) -> None:
    require(bool(s.bootstrap_servers), "BOOTSTRAP_SERVERS is empty")
    require(
        s.processing_guarantee in (EXACTLY_ONCE, AT_LEAST_ONCE),
        f"PROCESSING_GUARANTEE must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, not {s.processing_guarantee!r}",
    )
    require(s.on_poison in ("dead_letter", "stop"), f"ON_POISON must be dead_letter or stop, not {s.on_poison!r}")
    require(
        s.group_protocol in (CLASSIC, CONSUMER),
        f"GROUP_PROTOCOL must be {CLASSIC} or {CONSUMER}, not {s.group_protocol!r}",
    )
    require(
        s.producers in (PER_PARTITION, PER_PROCESS),
        f"PRODUCERS must be {PER_PARTITION} or {PER_PROCESS}, not {s.producers!r}",
    )
    require(
        "group.protocol" not in s.kafka,
        "PIPELINE_KAFKA_GROUP_PROTOCOL: set GROUP_PROTOCOL instead (the consumer's other properties depend on it)",
    )
    for name in (
        "commit_interval_ms",
        "commit_max_records",
        "poll_max_records",
        "processing_max_attempts",
        "session_timeout_ms",
        "transaction_timeout_ms",
        "request_timeout_ms",
        "connect_timeout_ms",
        "restore_step_ms",
        "timers_per_turn",
    ):
        require(getattr(s, name) > 0, f"{name.upper()} must be positive, not {getattr(s, name)}")
    require(s.kafka_log_interval_ms >= 0, f"KAFKA_LOG_INTERVAL_MS must not be negative, not {s.kafka_log_interval_ms}")
    require(s.dead_letter_storm >= 0, f"DEAD_LETTER_STORM must be 0 (off) or more, not {s.dead_letter_storm}")
    _validate_failover(s)
    require(s.processing_backoff_ms >= 0, f"PROCESSING_BACKOFF_MS must not be negative, not {s.processing_backoff_ms}")
    require(s.max_task_idle_ms >= -1, f"MAX_TASK_IDLE_MS must be -1 (never wait) or more, not {s.max_task_idle_ms}")
    require(s.session_timeout_ms >= 6_000, f"SESSION_TIMEOUT_MS={s.session_timeout_ms} is below the minimum 6000")
    require(
        s.heartbeat_interval_ms * 3 <= s.session_timeout_ms,
        f"HEARTBEAT_INTERVAL_MS={s.heartbeat_interval_ms} must be at most a third of SESSION_TIMEOUT_MS",
    )
    require(
        s.commit_interval_ms < s.transaction_timeout_ms,
        f"COMMIT_INTERVAL_MS={s.commit_interval_ms} must be below TRANSACTION_TIMEOUT_MS={s.transaction_timeout_ms}: "
        "the broker would abort every transaction before it is committed",
    )
    worst_retry_ms = s.processing_backoff_ms * (2**s.processing_max_attempts)
    require(
        s.restore_step_ms + s.request_timeout_ms + worst_retry_ms < s.max_poll_interval_ms,
        f"MAX_POLL_INTERVAL_MS={s.max_poll_interval_ms} is too short for RESTORE_STEP_MS + REQUEST_TIMEOUT_MS + "
        "processing retries: the group would evict this member while it works",
    )
    require(s.sink in ("kafka", "postgres"), f"SINK must be kafka or postgres, not {s.sink!r}")
    if s.sink == "postgres":
        _validate_postgres(s)
    require(
        s.transaction_timeout_ms <= 900_000,
        f"TRANSACTION_TIMEOUT_MS={s.transaction_timeout_ms} exceeds the broker's default transaction.max.timeout.ms",
    )


def _validate_failover(s: Settings) -> None:
    """The watchdogs: FAILURE_DETECTION_MS and LIVE_TIMEOUT_MS (issue 22), STALL_WARNING_MS; STANDBY_REPLICAS."""
    _validate_state_store(s)
    require(
        0 <= s.standby_replicas <= 8,
        f"STANDBY_REPLICAS={s.standby_replicas} must be from 0 (none) to 8: each copy holds another member's whole "
        "state in memory",
    )
    require(
        s.stall_warning_ms == 0 or s.stall_warning_ms >= 1_000,
        f"STALL_WARNING_MS={s.stall_warning_ms} must be 0 (off) or at least 1000: the watchdog looks once a second, "
        "and a shorter stall is a commit or a fetch, not a stall",
    )
    require(
        s.failure_detection_ms == 0 or 200 <= s.failure_detection_ms < s.session_timeout_ms,
        f"FAILURE_DETECTION_MS={s.failure_detection_ms} must be 0 (off) or from 200 up to below SESSION_TIMEOUT_MS "
        f"({s.session_timeout_ms}): shorter, a scheduling hiccup removes healthy members; longer, the session "
        "time-out comes first",
    )
    require(
        s.live_timeout_ms == 0 or s.live_timeout_ms > longest_turn_ms(s),
        f"LIVE_TIMEOUT_MS={s.live_timeout_ms} must exceed TRANSACTION_TIMEOUT_MS + 4 x REQUEST_TIMEOUT_MS "
        f"({longest_turn_ms(s)}), the longest a healthy turn of the poll loop blocks: /live would fail a healthy "
        "process",
    )


def _validate_queries(s: Settings) -> None:
    require(not s.query_enabled or s.metrics_port > 0, "QUERY_ENABLED needs METRICS_PORT")
    require(
        s.query_partitioner in ("murmur2", "crc32"), f"QUERY_PARTITIONER: murmur2 or crc32, not {s.query_partitioner!r}"
    )
    require(s.query_wait_ms >= 0, f"QUERY_WAIT_MS must not be negative, not {s.query_wait_ms}")


def _validate_state_store(s: Settings) -> None:
    require(s.state_store in ("memory", "disk"), f"STATE_STORE must be memory or disk, not {s.state_store!r}")
    disk = s.state_store == "disk"
    require(not disk or bool(s.state_dir), "STATE_STORE=disk needs STATE_DIR, the directory its stores live in")
    require(not disk or s.sink == "kafka", "STATE_STORE=disk is for SINK=kafka (PostgreSQL keeps that sink's state)")
    require(min(s.state_block_cache_mb, s.state_write_buffer_mb) > 0, "STATE_*_MB must be positive")


def validate_registry(s: Settings) -> None:
    """SCHEMA_REGISTRY_*: whether the registry answers is asked at start-up (pipeline/registry.py: check)."""
    for url in filter(None, (u.strip() for u in s.schema_registry_url.split(","))):
        require(
            url.startswith(("http://", "https://")),
            f"SCHEMA_REGISTRY_URL must be http:// or https:// URLs, not {url!r}",
        )
        require(
            "@" not in url.split("//", 1)[1].split("/", 1)[0],
            "SCHEMA_REGISTRY_URL holds credentials (user:password@): give them as SCHEMA_REGISTRY_USER_INFO, a secret "
            "kept out of logs",
        )
    require(
        not s.schema_registry_user_info or ":" in s.schema_registry_user_info,
        "SCHEMA_REGISTRY_USER_INFO must be user:password",
    )
    require(
        s.schema_registry_timeout_ms > 0,
        f"SCHEMA_REGISTRY_TIMEOUT_MS must be positive, not {s.schema_registry_timeout_ms}",
    )
    require(
        not s.schema_registry_url or s.schema_registry_timeout_ms < s.transaction_timeout_ms,
        f"SCHEMA_REGISTRY_TIMEOUT_MS={s.schema_registry_timeout_ms} must be below TRANSACTION_TIMEOUT_MS="
        f"{s.transaction_timeout_ms}: a request waits inside an open transaction",
    )


def longest_turn_ms(s: Settings) -> int:
    """The longest a healthy turn of the poll loop blocks (a take-over's fence, then its committed offsets)."""
    return s.transaction_timeout_ms + 4 * s.request_timeout_ms


def live_timeout_ms(s: Settings) -> int:
    """LIVE_TIMEOUT_MS, or when 0 the longest healthy turn + 10 s."""
    return s.live_timeout_ms or longest_turn_ms(s) + 10_000


def _validate_postgres(s: Settings) -> None:
    require(bool(s.postgres_dsn), "POSTGRES_DSN is empty: SINK=postgres needs a connection string")
    require(bool(s.postgres_schema), "POSTGRES_SCHEMA is empty")
    require(
        s.exactly_once,
        "SINK=postgres is exactly-once by construction: PROCESSING_GUARANTEE must be "
        f"{EXACTLY_ONCE}, not {s.processing_guarantee!r}",
    )
    for name in ("postgres_pool_size", "postgres_retry_backoff_max_ms", "postgres_idle_in_transaction_timeout_ms"):
        require(getattr(s, name) > 0, f"{name.upper()} must be positive, not {getattr(s, name)}")
    require(
        s.postgres_idle_in_transaction_timeout_ms < s.request_timeout_ms,
        f"POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT_MS={s.postgres_idle_in_transaction_timeout_ms} must be below "
        f"REQUEST_TIMEOUT_MS={s.request_timeout_ms} (the lock timeout): a new owner's fence waits for a paused "
        "writer's session to be ended",
    )


def load(config_file: str | Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from a TOML file, then the environment, then keyword overrides."""
    return Settings.load(config_file, env, **overrides)


def _field_types(cls: type[Settings]) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.name != "kafka"}


def _declared_by_subclasses(cls: type[Settings]) -> set[str]:
    """Names of the fields that service-specific subclasses of Settings add: another loader's, not unknown."""
    names: set[str] = set()
    for sub in cls.__subclasses__():
        names |= {f.name for f in fields(sub)} | _declared_by_subclasses(sub)
    return names


def _coerce(name: str, kind: type, raw: Any) -> Any:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).strip().lower() in ("true", "1", "yes", "on"):
            return True
        if str(raw).strip().lower() in ("false", "0", "no", "off", ""):
            return False
        raise ConfigError(f"{name.upper()} must be true or false, not {raw!r}")
    if kind is int:
        if isinstance(raw, (bool, float)) or not isinstance(raw, (int, str)):
            raise ConfigError(f"{name.upper()} must be an integer, not {raw!r}")
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name.upper()} must be an integer, not {raw!r}") from None
    if kind is str:
        return str(raw)
    raise TypeError(f"setting {name}: type {kind} cannot be read from text (use str, int or bool)")


def _from_env(cls: type[Settings], env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    known = _field_types(cls)
    elsewhere = _declared_by_subclasses(Settings)
    values: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    for key, raw in env.items():
        if key.startswith(KAFKA_ENV_PREFIX):
            kafka[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = raw
        elif (
            key.startswith(ENV_PREFIX)
            and key != ENV_PREFIX + "CONFIG_FILE"
            and not key.startswith(SPARK_KAFKA_ENV_PREFIX)
        ):
            name = key[len(ENV_PREFIX) :].lower()
            if name in known:
                values[name] = _coerce(name, known[name], raw)
            elif name not in elsewhere:
                raise ConfigError(f"unknown setting {key} (known: {', '.join(sorted(n.upper() for n in known))})")
    return values, kafka


def _from_toml(cls: type[Settings], path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"CONFIG_FILE {path}: {e}") from e
    kafka = {str(k): str(v) for k, v in document.pop("kafka", {}).items()}
    known = _field_types(cls)
    unknown = set(document) - set(known) - _declared_by_subclasses(Settings)
    if unknown:
        raise ConfigError(f"CONFIG_FILE {path}: unknown settings {sorted(unknown)}")
    return {k: _coerce(k, known[k], v) for k, v in document.items() if k in known}, kafka
