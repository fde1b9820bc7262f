"""The start-up checks name what is wrong: the permission check (pipeline/kafka/permissions.py) the operation and
the resource, the connection check (pipeline/kafka/connect.py) the setting. Fake admin clients stand in for the
broker; the secured broker's real answers are exercised by tests/security."""

from __future__ import annotations

import subprocess
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclOperation

from pipeline import settings as settings_module
from pipeline.kafka import connect
from pipeline.kafka.acls import Names
from pipeline.kafka.connect import ConnectionRefused, config_problem, connect_check, refusal
from pipeline.kafka.permissions import (
    AFTER_TOPICS,
    BEFORE_TOPICS,
    HINT,
    MissingPermission,
    check_service,
    missing_transactional_id,
)
from pipeline.settings import ConfigError

NAMES = Names("x", "x-in", "x-out")
SETTINGS = settings_module.load(env={}, kafka={"sasl.username": "pipeline", "sasl.password": "secret"})
ALL_TOPIC_OPS = {"READ", "WRITE", "DESCRIBE"}
ABSENT, DENIED = "absent", "denied"


def _future(value: object = None, error: int | None = None) -> Future:
    future: Future = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(KafkaException(KafkaError(error)))
    return future


def _described(granted: set[str] | str | None, denied_code: int) -> Future:
    if granted == ABSENT:
        return _future(error=KafkaError.UNKNOWN_TOPIC_OR_PART)
    if granted == DENIED:
        return _future(error=denied_code)
    if isinstance(granted, int):
        return _future(error=granted)
    operations = None if granted is None else [AclOperation[op] for op in sorted(granted)]
    return _future(SimpleNamespace(authorized_operations=operations))


class FakeAdmin:
    """Answers like a broker with an authorizer: per topic and group the granted operations, DENIED (not even
    DESCRIBE) or ABSENT (the principal may see it, it does not exist); CREATE per topic name."""

    def __init__(self, topics: dict | None = None, groups: dict | None = None, creatable: set[str] | None = None):
        # x-liveness: the heartbeat topic of FAILURE_DETECTION_MS, on by default
        internal = ("x-changelog", "x-snapshots", "x-dlq", "x-liveness")
        self.topics = {t: ALL_TOPIC_OPS for t in ("x-in", "x-out", *internal)}
        self.topics |= topics or {}
        self.groups = {"x": {"READ", "DESCRIBE"}} | (groups or {})
        self.creatable = creatable if creatable is not None else set(internal)
        self.asked: list[str] = []
        self.validated: list[str] = []

    def describe_topics(self, topics, include_authorized_operations: bool, request_timeout: float) -> dict:
        assert include_authorized_operations
        self.asked += topics.topic_names
        return {
            t: _described(self.topics.get(t, DENIED), KafkaError.TOPIC_AUTHORIZATION_FAILED) for t in topics.topic_names
        }

    def describe_consumer_groups(self, groups, include_authorized_operations: bool, request_timeout: float) -> dict:
        assert include_authorized_operations
        self.asked += [f"group:{g}" for g in groups]
        return {g: _described(self.groups.get(g, DENIED), KafkaError.GROUP_AUTHORIZATION_FAILED) for g in groups}

    def create_topics(self, new_topics, validate_only: bool, request_timeout: float) -> dict:
        assert validate_only, "the check must never create a topic"
        self.validated += [t.topic for t in new_topics]
        return {
            t.topic: _future(error=None if t.topic in self.creatable else KafkaError.TOPIC_AUTHORIZATION_FAILED)
            for t in new_topics
        }


def check(
    admin: FakeAdmin, phase: str = BEFORE_TOPICS, settings: settings_module.Settings = SETTINGS, stateful: bool = True
) -> None:
    check_service(admin, NAMES, settings, stateful=stateful, phase=phase)


def failure(admin: FakeAdmin, phase: str = BEFORE_TOPICS, **kwargs) -> str:
    with pytest.raises(MissingPermission) as raised:
        check(admin, phase, **kwargs)
    return str(raised.value)


# -- permissions ------------------------------------------------------------------------------------------------------
def test_everything_granted_passes_both_phases() -> None:
    admin = FakeAdmin()
    check(admin)
    check(admin, AFTER_TOPICS)
    assert admin.validated == []  # every topic exists: nothing to create, no CREATE asked


def test_a_missing_write_is_named_with_the_topic_why_and_what_is_granted() -> None:
    message = failure(FakeAdmin(topics={"x-dlq": {"DESCRIBE"}}))

    assert message == (
        "missing Kafka permission (sasl.username 'pipeline'): WRITE on topic 'x-dlq' "
        f"(dead letters; granted: DESCRIBE). {HINT}"
    )


def test_a_topic_the_principal_may_not_even_describe_is_not_called_absent() -> None:
    message = failure(FakeAdmin(topics={"x-in": DENIED}))

    assert "READ on topic 'x-in' (the group consumer; granted: none)" in message
    assert "does not exist" not in message


def test_every_gap_is_named_at_once() -> None:
    message = failure(
        FakeAdmin(
            topics={"x-out": {"DESCRIBE", "READ"}, "x-changelog": {"DESCRIBE", "READ"}}, groups={"x": {"DESCRIBE"}}
        )
    )

    assert message.startswith("missing Kafka permissions (sasl.username 'pipeline'): ")
    assert "WRITE on topic 'x-out' (outputs; granted: DESCRIBE, READ)" in message
    assert (
        "WRITE on topic 'x-changelog' (state changes and checkpoints; read back by restores; granted: "
        "DESCRIBE, READ)" in message
    )
    assert (
        "READ on group 'x' (membership, committed offsets, send_offsets_to_transaction; LeaveGroup of a silent peer; "
        "granted: DESCRIBE)" in message
    )


def test_a_group_the_principal_may_not_describe() -> None:
    assert (
        "READ on group 'x' (membership, committed offsets, send_offsets_to_transaction; LeaveGroup of a silent peer; "
        "granted: none)" in failure(FakeAdmin(groups={"x": DENIED}))
    )


def test_internal_topics_not_there_yet_need_create_asked_without_creating() -> None:
    absent = {"x-changelog": ABSENT, "x-snapshots": ABSENT, "x-dlq": ABSENT}
    admin = FakeAdmin(topics=absent, creatable={"x-changelog", "x-dlq"})

    message = failure(admin)

    assert admin.validated == ["x-changelog", "x-snapshots", "x-dlq"]
    assert message == (
        "missing Kafka permission (sasl.username 'pipeline'): CREATE on topic 'x-snapshots' "
        f"(created at start-up if missing (pre-create them and drop this)). {HINT}"
    )
    check(FakeAdmin(topics=absent))  # with CREATE: the topic check goes on and creates them


def test_after_the_topics_exist_only_topics_are_checked_again() -> None:
    admin = FakeAdmin(topics={"x-changelog": {"DESCRIBE", "WRITE"}, "x-dlq": ABSENT}, groups={"x": DENIED})

    message = failure(admin, AFTER_TOPICS)

    assert "READ on topic 'x-changelog'" in message and "group" not in message
    assert admin.validated == []  # no CREATE after the topics were created (or found)


def test_a_missing_input_topic_is_left_to_the_topic_check() -> None:
    check(FakeAdmin(topics={"x-in": ABSENT}))  # ensure_topics says "INPUT_TOPIC: topic 'x-in' does not exist"


def test_what_the_broker_cannot_tell_never_fails_the_start() -> None:
    check(FakeAdmin(topics={"x-out": None}, groups={"x": None}))  # a broker before KIP-430: no operations reported
    check(FakeAdmin(topics={"x-out": KafkaError._TIMED_OUT}, groups={"x": KafkaError.COORDINATOR_NOT_AVAILABLE}))


def test_the_sink_and_the_app_decide_what_is_asked() -> None:
    pg = FakeAdmin(topics={"x-out": DENIED})
    check(pg, settings=SETTINGS.with_overrides(sink="postgres", postgres_dsn="postgresql://db/x"))
    assert pg.asked == ["x-in", "group:x"]

    stateless = FakeAdmin(topics={"x-changelog": DENIED, "x-snapshots": DENIED})
    check(stateless, stateful=False)
    assert "x-changelog" not in stateless.asked

    with_snapshots = FakeAdmin(topics={"x-snapshots": {"DESCRIBE", "READ"}})
    check(with_snapshots)
    message = failure(with_snapshots, settings=SETTINGS.with_overrides(snapshot_on_shutdown=True))
    assert "WRITE on topic 'x-snapshots' (full snapshots read by restores and written on shutdown" in message


def test_no_principal_named_without_a_sasl_username() -> None:
    message = failure(FakeAdmin(topics={"x-dlq": {"DESCRIBE"}}), settings=settings_module.load(env={}))
    assert message.startswith("missing Kafka permission: WRITE on topic 'x-dlq'")


def test_a_phase_is_one_of_two() -> None:
    with pytest.raises(ValueError, match="phase must be"):
        check(FakeAdmin(), "whenever")


def test_a_fence_refused_for_want_of_a_transactional_id_acl_is_named() -> None:
    error = KafkaError(
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed", fatal=True
    )
    missing = missing_transactional_id(error, "x.x-in.0")

    assert isinstance(missing, ConfigError)  # `pipeline run`: "configuration error: ...", exit code 2
    assert str(missing).startswith("missing Kafka permission: WRITE and DESCRIBE on transactional-id 'x.x-in.0' ")
    assert missing_transactional_id(KafkaError(KafkaError._TIMED_OUT), "x.x-in.0") is None


# -- connection -------------------------------------------------------------------------------------------------------
AUTH_FAILED = KafkaError(
    KafkaError._AUTHENTICATION,
    "sasl_ssl://127.0.0.1:9192/bootstrap: SASL authentication "
    "error: Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512 (after 316ms in state AUTH_REQ)",
)
UNTRUSTED = KafkaError(
    KafkaError._SSL,
    "sasl_ssl://127.0.0.1:9192/bootstrap: SSL handshake failed: error:0A000086:"
    "SSL routines::certificate verify failed: broker certificate could not be verified",
)


def test_refusals_name_the_setting() -> None:
    assert refusal(AUTH_FAILED).startswith(
        "PIPELINE_KAFKA_SASL_USERNAME / PIPELINE_KAFKA_SASL_PASSWORD: authentication failed"
    )
    assert refusal(UNTRUSTED).startswith("PIPELINE_KAFKA_SSL_CA_LOCATION: the broker's certificate is not trusted")
    mechanism = KafkaError(
        KafkaError._AUTHENTICATION,
        "SASL PLAIN mechanism handshake failed: Broker: Unsupported "
        "SASL mechanism: broker's supported mechanisms: SCRAM-SHA-512",
    )
    assert refusal(mechanism).startswith("PIPELINE_KAFKA_SASL_MECHANISMS: ")
    assert refusal(KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9 failed")) is None
    assert refusal(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")) is None


def test_config_problems_name_the_setting_and_keep_secret_values_out() -> None:
    def problem(text: str) -> str:
        return config_problem(KafkaError(KafkaError._INVALID_ARG, text))

    assert problem('No such configuration property: "foo.bar"').startswith("PIPELINE_KAFKA_FOO_BAR: ")
    assert problem('Invalid value "FOO" for configuration property "security.protocol"').startswith(
        "PIPELINE_KAFKA_SECURITY_PROTOCOL: "
    )
    secret = problem('Invalid value "hunter2" for configuration property "sasl.password"')
    assert secret.startswith("PIPELINE_KAFKA_SASL_PASSWORD: ") and "hunter2" not in secret
    assert problem(
        "Failed to create admin client: ssl.key.location failed: error:0A080009:SSL routines::PEM lib"
    ).startswith("PIPELINE_KAFKA_SSL_KEY_LOCATION / PIPELINE_KAFKA_SSL_KEY_PASSWORD: ")
    assert problem(
        "Java JAAS configuration is not supported, see https://github.com/confluentinc/librdkafka"
    ).startswith("PIPELINE_KAFKA_SASL_JAAS_CONFIG: ")


class RefusingAdmin:
    """An admin client whose broker refuses it: the error arrives through error_cb while polling."""

    def __init__(self, config: dict) -> None:
        self.error_cb = config["error_cb"]

    def describe_cluster(self, request_timeout: float) -> Future:
        return Future()  # never answered, as with librdkafka retrying a refused broker

    def poll(self, timeout: float) -> int:
        self.error_cb(AUTH_FAILED)
        return 0


def test_connect_check_stops_at_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "AdminClient", RefusingAdmin)
    with pytest.raises(ConnectionRefused, match=r"^PIPELINE_KAFKA_SASL_USERNAME / PIPELINE_KAFKA_SASL_PASSWORD"):
        connect_check(SETTINGS, timeout_s=30)


def test_connect_check_without_a_broker_is_bounded() -> None:
    settings = settings_module.load(env={}, bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"BOOTSTRAP_SERVERS: no cluster metadata within 1s from '127\.0\.0\.1:1'"):
        connect_check(settings, timeout_s=1)


def test_connect_check_names_an_unknown_property() -> None:
    with pytest.raises(ConnectionRefused, match=r"^PIPELINE_KAFKA_NO_SUCH_THING: "):
        connect_check(settings_module.load(env={"PIPELINE_KAFKA_NO_SUCH_THING": "1"}), timeout_s=1)


def test_connect_check_names_the_key_password_and_never_shows_it(tmp_path: Path) -> None:
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-days",
            "1",
            "-subj",
            "/CN=client",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-passout",
            "pass:the-right-one",
        ],
        check=True,
        capture_output=True,
    )
    sentinel = "SENTINEL-key-password-4f9c"
    settings = settings_module.load(
        env={
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
            "PIPELINE_KAFKA_SSL_KEY_LOCATION": str(key),
            "PIPELINE_KAFKA_SSL_CERTIFICATE_LOCATION": str(cert),
            "PIPELINE_KAFKA_SSL_KEY_PASSWORD": sentinel,
        }
    )
    with pytest.raises(ConnectionRefused) as raised:
        connect_check(settings, timeout_s=1)
    assert str(raised.value).startswith("PIPELINE_KAFKA_SSL_KEY_LOCATION / PIPELINE_KAFKA_SSL_KEY_PASSWORD: ")
    assert sentinel not in str(raised.value) and sentinel not in repr(raised.value)
