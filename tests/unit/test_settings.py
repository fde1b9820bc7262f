"""settings.load: defaults < TOML file < environment < overrides; every error names the setting; secrets redacted."""

from __future__ import annotations

import dataclasses
import pprint
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.kafka.clients import client_config, consumer_config, producer_config, restore_consumer_config
from pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, ConfigError, Settings, load


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load(env={})
    assert s == Settings()
    assert s.exactly_once and s.processing_guarantee == EXACTLY_ONCE
    assert s.kafka == {}


def test_from_env() -> None:
    s = load(
        env={
            "PIPELINE_BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
            "PIPELINE_APP_ID": "totals",
            "PIPELINE_COMMIT_INTERVAL_MS": "250",
            "PIPELINE_PROCESSING_GUARANTEE": AT_LEAST_ONCE,
            "PIPELINE_ON_POISON": "stop",
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PIPELINE_KAFKA_SASL_MECHANISM": "PLAIN",
            "OTHER_VARIABLE": "ignored",
        }
    )
    assert s.bootstrap_servers == "b1:9092,b2:9092"
    assert s.app_id == "totals"
    assert s.commit_interval_ms == 250 and isinstance(s.commit_interval_ms, int)
    assert not s.exactly_once
    assert s.on_poison == "stop"
    assert s.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}


def test_from_toml_with_a_kafka_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
app_id = "from-file"
commit_interval_ms = 300
input_topic = "in"

[kafka]
"security.protocol" = "SSL"
"linger.ms" = 5
""",
    )
    s = load(path, env={})
    assert (s.app_id, s.commit_interval_ms, s.input_topic) == ("from-file", 300, "in")
    assert s.kafka == {"security.protocol": "SSL", "linger.ms": "5"}


def test_config_file_named_by_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, 'app_id = "via-env"\n')
    assert load(env={"PIPELINE_CONFIG_FILE": str(path)}).app_id == "via-env"


def test_precedence_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
app_id = "file"
input_topic = "file-in"
output_topic = "file-out"
commit_interval_ms = 300

[kafka]
"security.protocol" = "SSL"
"client.id" = "file"
"linger.ms" = "1"
""",
    )
    env = {
        "PIPELINE_INPUT_TOPIC": "env-in",
        "PIPELINE_OUTPUT_TOPIC": "env-out",
        "PIPELINE_KAFKA_CLIENT_ID": "env",
        "PIPELINE_KAFKA_LINGER_MS": "2",
    }
    s = load(path, env=env, output_topic="override-out", commit_interval_ms=None, kafka={"linger.ms": "3"})
    assert s.app_id == "file"  # only in the file
    assert s.input_topic == "env-in"  # env beats the file
    assert s.output_topic == "override-out"  # overrides beat env
    assert s.commit_interval_ms == 300  # an override of None means "not given"
    assert s.kafka == {"security.protocol": "SSL", "client.id": "env", "linger.ms": "3"}


def test_with_overrides_validates_again() -> None:
    s = Settings()
    assert s.with_overrides(app_id="x").app_id == "x"
    with pytest.raises(ConfigError, match="ON_POISON"):
        s.with_overrides(on_poison="ignore")


# -- every error names the setting ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"PIPELINE_FOO": "1"}, ["PIPELINE_FOO"]),
        ({"PIPELINE_COMMIT_INTERVAL_MS": "fast"}, ["COMMIT_INTERVAL_MS", "integer", "'fast'"]),
        ({"PIPELINE_SESSION_TIMEOUT_MS": "1.5"}, ["SESSION_TIMEOUT_MS", "integer"]),
        (
            {"PIPELINE_COMMIT_INTERVAL_MS": "10000", "PIPELINE_TRANSACTION_TIMEOUT_MS": "10000"},
            ["COMMIT_INTERVAL_MS", "TRANSACTION_TIMEOUT_MS"],
        ),
        ({"PIPELINE_SESSION_TIMEOUT_MS": "5999"}, ["SESSION_TIMEOUT_MS", "6000"]),
        (
            {"PIPELINE_SESSION_TIMEOUT_MS": "9000", "PIPELINE_HEARTBEAT_INTERVAL_MS": "3001"},
            ["HEARTBEAT_INTERVAL_MS", "SESSION_TIMEOUT_MS"],
        ),
        ({"PIPELINE_PROCESSING_GUARANTEE": "exactly-once"}, ["PROCESSING_GUARANTEE", "'exactly-once'"]),
        ({"PIPELINE_ON_POISON": "skip"}, ["ON_POISON", "'skip'"]),
        ({"PIPELINE_COMMIT_MAX_RECORDS": "0"}, ["COMMIT_MAX_RECORDS"]),
        ({"PIPELINE_BOOTSTRAP_SERVERS": ""}, ["BOOTSTRAP_SERVERS"]),
        ({"PIPELINE_TRANSACTION_TIMEOUT_MS": "900001"}, ["TRANSACTION_TIMEOUT_MS"]),
        ({"PIPELINE_MAX_POLL_INTERVAL_MS": "5000"}, ["MAX_POLL_INTERVAL_MS"]),
        ({"PIPELINE_STALL_WARNING_MS": "500"}, ["STALL_WARNING_MS=500", "0 (off)"]),
        ({"PIPELINE_STALL_WARNING_MS": "-1"}, ["STALL_WARNING_MS=-1"]),
    ],
    ids=[
        "unknown",
        "not-an-integer",
        "float",
        "commit-interval-vs-txn-timeout",
        "session-below-6000",
        "heartbeat-over-a-third",
        "guarantee-typo",
        "on-poison-typo",
        "non-positive",
        "empty-bootstrap",
        "txn-timeout-over-broker-max",
        "max-poll-too-short",
        "stall-warning-below-a-second",
        "stall-warning-negative",
    ],
)
def test_errors_name_the_setting(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        load(env=env)
    for name in names:
        assert name in str(raised.value)


def test_the_stall_watchdog_is_on_by_default_and_0_turns_it_off() -> None:
    assert load(env={}).stall_warning_ms == 30_000
    assert load(env={"PIPELINE_STALL_WARNING_MS": "0"}).stall_warning_ms == 0


def test_a_heartbeat_of_exactly_a_third_is_fine() -> None:
    assert load(env={"PIPELINE_SESSION_TIMEOUT_MS": "9000", "PIPELINE_HEARTBEAT_INTERVAL_MS": "3000"})


def test_errors_in_the_file_name_the_file_and_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pipeline\.toml.*unknown settings \['colour'\]"):
        load(write(tmp_path, 'colour = "red"\n'), env={})
    with pytest.raises(ConfigError, match="COMMIT_INTERVAL_MS must be an integer"):
        load(write(tmp_path, 'commit_interval_ms = "soon"\n'), env={})
    with pytest.raises(ConfigError, match=r"CONFIG_FILE .*pipeline\.toml"):
        load(write(tmp_path, "this is = not toml ["), env={})
    with pytest.raises(ConfigError, match=r"CONFIG_FILE .*missing\.toml"):
        load(tmp_path / "missing.toml", env={})


def test_errors_are_value_errors_for_callers_that_catch_those() -> None:
    with pytest.raises(ValueError, match="ON_POISON"):
        Settings(on_poison="drop")


@pytest.mark.parametrize("raw", ["1500.7", "true"])
def test_a_non_integer_in_the_file_is_rejected(tmp_path: Path, raw: str) -> None:
    with pytest.raises(ConfigError, match="COMMIT_INTERVAL_MS"):
        load(write(tmp_path, f"commit_interval_ms = {raw}\n"), env={})


def test_a_negative_backoff_is_rejected() -> None:
    with pytest.raises(ConfigError, match="PROCESSING_BACKOFF_MS"):
        load(env={"PIPELINE_PROCESSING_BACKOFF_MS": "-1"})


# -- secrets ---------------------------------------------------------------------------------------------------------
def test_redacted_kafka_hides_secrets_and_keeps_the_rest() -> None:
    s = load(
        env={
            "PIPELINE_KAFKA_SASL_PASSWORD": "hunter2",
            "PIPELINE_KAFKA_SSL_KEY_PASSWORD": "s3cret",
            "PIPELINE_KAFKA_SASL_USERNAME": "alice",
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        }
    )
    redacted = s.redacted_kafka()
    assert redacted == {
        "sasl.password": "***",
        "ssl.key.password": "***",
        "sasl.username": "alice",
        "security.protocol": "SASL_SSL",
    }
    assert "hunter2" not in repr(redacted) and "s3cret" not in repr(redacted)
    assert s.kafka["sasl.password"] == "hunter2"  # the clients still get the real value


def test_a_boolean_setting_takes_the_usual_spellings_and_names_itself_when_wrong():
    assert load(env={"PIPELINE_SNAPSHOT_ON_SHUTDOWN": "true"}).snapshot_on_shutdown is True
    assert load(env={"PIPELINE_SNAPSHOT_ON_SHUTDOWN": "0"}).snapshot_on_shutdown is False
    with pytest.raises(ConfigError, match="SNAPSHOT_ON_SHUTDOWN must be true or false, not 'maybe'"):
        load(env={"PIPELINE_SNAPSHOT_ON_SHUTDOWN": "maybe"})


def test_secrets_never_show_in_repr_str_or_dumps_of_the_settings() -> None:
    secrets = {
        "PIPELINE_KAFKA_SASL_PASSWORD": "hunter2",
        "PIPELINE_KAFKA_SASL_JAAS_CONFIG": 'PlainLoginModule required username="alice" password="jaas-pw";',
        "PIPELINE_KAFKA_SSL_KEY_PASSWORD": "key-pw",
        "PIPELINE_POSTGRES_DSN": "postgresql://alice:dsn-pw@db:5432/app",
    }
    s = load(env={**secrets, "PIPELINE_SINK": "postgres", "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    shown = [
        repr(s),
        str(s),
        f"{s!r}",
        repr(s.kafka),
        repr(dataclasses.asdict(s)),
        pprint.pformat(s),
        repr(s.redacted_kafka()),
        repr(s.with_overrides(app_id="x")),
    ]
    for text in shown:
        for word in ("hunter2", "jaas-pw", "key-pw", "dsn-pw"):
            assert word not in text, (word, text)
    assert "SASL_SSL" in repr(s)  # what is not secret stays visible
    # ...while the clients and the database get the real values
    assert s.postgres_dsn == "postgresql://alice:dsn-pw@db:5432/app" and f"{s.postgres_dsn}".endswith("@db:5432/app")
    assert client_config(s)["sasl.password"] == "hunter2" and str(s.kafka["ssl.key.password"]) == "key-pw"


def test_the_kafka_passthrough_cannot_switch_off_what_the_protocol_needs() -> None:
    """PIPELINE_KAFKA_* reaches every client, but the protocol's own properties are set after it
    (docs/guarantees.md: read-committed, one-transaction)."""
    s = load(
        env={
            "PIPELINE_KAFKA_ISOLATION_LEVEL": "read_uncommitted",
            "PIPELINE_KAFKA_ENABLE_AUTO_COMMIT": "true",
            "PIPELINE_KAFKA_ENABLE_AUTO_OFFSET_STORE": "true",
            "PIPELINE_KAFKA_ENABLE_IDEMPOTENCE": "false",
            "PIPELINE_KAFKA_ACKS": "1",
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
            "PIPELINE_KAFKA_PARTITIONER": "random",
            "PIPELINE_KAFKA_LINGER_MS": "20",  # a tuning default: the user's wins
            "PIPELINE_KAFKA_QUEUED_MIN_MESSAGES": "500",  # another
        }
    )
    consumer, restore = consumer_config(s, "group"), restore_consumer_config(s, "group.restore")
    producer = producer_config(s, "app.in.0")
    assert (consumer["isolation.level"], consumer["enable.auto.commit"], consumer["enable.auto.offset.store"]) == (
        "read_committed",
        False,
        False,
    )
    assert (restore["isolation.level"], restore["enable.auto.commit"]) == ("read_committed", False)
    assert (producer["enable.idempotence"], producer["acks"], producer["transactional.id"]) == (True, "all", "app.in.0")
    assert (producer["partitioner"], producer["linger.ms"]) == ("murmur2_random", "20")
    assert consumer["queued.min.messages"] == "500"
    assert consumer_config(load(env={}), "group")["queued.min.messages"] == 2_000  # prefetch spread over partitions
    assert consumer["security.protocol"] == restore["security.protocol"] == producer["security.protocol"] == "SSL"


# -- a service's own settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PricingSettings(Settings):
    price_feed_url: str = "http://prices:8080"
    max_discount_percent: int = 30
    discounts_enabled: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.max_discount_percent <= 100:
            raise ConfigError(f"MAX_DISCOUNT_PERCENT must be 0..100, not {self.max_discount_percent}")


def test_a_service_extends_the_settings_with_its_own(tmp_path: Path) -> None:
    path = write(tmp_path, 'price_feed_url = "http://file"\napp_id = "pricing"\n')
    env = {
        "PIPELINE_MAX_DISCOUNT_PERCENT": "40",
        "PIPELINE_DISCOUNTS_ENABLED": "off",
        "PIPELINE_COMMIT_INTERVAL_MS": "7",
    }
    s = PricingSettings.load(path, env=env)
    assert isinstance(s, PricingSettings)
    assert (s.price_feed_url, s.max_discount_percent, s.discounts_enabled) == ("http://file", 40, False)
    assert (s.app_id, s.commit_interval_ms) == ("pricing", 7)
    assert PricingSettings.load(env={}, max_discount_percent=10).max_discount_percent == 10
    with pytest.raises(ConfigError, match="MAX_DISCOUNT_PERCENT must be an integer, not 'lots'"):
        PricingSettings.load(env={"PIPELINE_MAX_DISCOUNT_PERCENT": "lots"})
    with pytest.raises(ConfigError, match=r"MAX_DISCOUNT_PERCENT must be 0\.\.100"):
        PricingSettings.load(env={"PIPELINE_MAX_DISCOUNT_PERCENT": "101"})
    with pytest.raises(ConfigError, match="ON_POISON"):  # the pipeline's own checks still run
        PricingSettings.load(env={"PIPELINE_ON_POISON": "skip"})


def test_the_base_loader_leaves_a_subclass_setting_alone_and_still_rejects_unknown_ones(tmp_path: Path) -> None:
    """`pipeline run` loads the base Settings in a process whose service module declared PricingSettings."""
    s = load(write(tmp_path, 'price_feed_url = "http://file"\n'), env={"PIPELINE_MAX_DISCOUNT_PERCENT": "40"})
    assert s == Settings() and not hasattr(s, "max_discount_percent")
    with pytest.raises(ConfigError, match="PIPELINE_MAX_DISCOUNT"):
        load(env={"PIPELINE_MAX_DISCOUNT": "40"})
