"""A wrong password or an untrusted certificate fails `pipeline run` at start, within a bound, with a message naming
the setting to fix (librdkafka alone would retry for ever); the check itself (pipeline/kafka/connect.py) against
the real secured broker."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pipeline import settings as settings_module
from pipeline.kafka.connect import ConnectionRefused, connect_check
from pipeline.settings import ConfigError
from tests.security.conftest import refused_start, service_config

pytestmark = pytest.mark.secure
START_BOUND_S = 15
WRONG_PASSWORD = "not-the-password"
AUTHENTICATION = "PIPELINE_KAFKA_SASL_USERNAME / PIPELINE_KAFKA_SASL_PASSWORD: authentication failed"
UNTRUSTED = "PIPELINE_KAFKA_SSL_CA_LOCATION: the broker's certificate is not trusted"


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA that did not sign the broker's certificate."""
    directory = tmp_path_factory.mktemp("other-ca")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
            "-keyout",
            str(directory / "ca.key"),
            "-out",
            str(directory / "ca.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return str(directory / "ca.pem")


@pytest.mark.parametrize("sink", ["kafka", "postgres"])
@pytest.mark.parametrize("case", ["wrong-password", "unknown-user", "untrusted-ca"])
def test_bad_credentials_fail_at_start_naming_the_setting(
    case: str, sink: str, kafka_secure, secure_run, other_ca: str
) -> None:
    overrides, expected = {
        "wrong-password": ({"sasl.password": WRONG_PASSWORD}, AUTHENTICATION),
        "unknown-user": ({"sasl.username": "nobody"}, AUTHENTICATION),
        "untrusted-ca": ({"ssl.ca.location": other_ca}, UNTRUSTED),
    }[case]
    # The PostgreSQL sink checks Kafka first: its database is never reached here.
    env = {"sink": "postgres", "postgres_dsn": "postgresql://nobody@127.0.0.1:1/none"} if sink == "postgres" else {}
    run = secure_run(service=service_config(kafka_secure, **overrides), **env)

    started = time.monotonic()
    log = refused_start(run, START_BOUND_S, case)
    assert f"configuration error: {expected}" in log, log
    assert "Traceback" not in log
    assert time.monotonic() - started < START_BOUND_S


def _settings(kafka_secure, **overrides: str) -> settings_module.Settings:
    return settings_module.load(
        env={}, bootstrap_servers=kafka_secure.bootstrap, kafka=service_config(kafka_secure, **overrides)
    )


def test_connect_check_passes_good_credentials_and_names_bad_ones(kafka_secure, other_ca: str) -> None:
    started = time.monotonic()
    connect_check(_settings(kafka_secure), timeout_s=10)
    with pytest.raises(ConnectionRefused, match=AUTHENTICATION):
        connect_check(_settings(kafka_secure, **{"sasl.password": WRONG_PASSWORD}), timeout_s=10)
    with pytest.raises(ConnectionRefused, match=UNTRUSTED):
        connect_check(_settings(kafka_secure, **{"ssl.ca.location": other_ca}), timeout_s=10)
    assert time.monotonic() - started < 10  # each refusal at the first error, not at the time-out


def test_a_plaintext_client_on_the_secured_port_is_a_bounded_metadata_failure(kafka_secure) -> None:
    plaintext = settings_module.load(env={}, bootstrap_servers=kafka_secure.bootstrap)
    with pytest.raises(
        ConfigError,
        match=r"BOOTSTRAP_SERVERS: no cluster metadata within 2s .*"
        r"PIPELINE_KAFKA_SECURITY_PROTOCOL",
    ):
        connect_check(plaintext, timeout_s=2)


def test_an_unreadable_ca_file_is_named(kafka_secure, tmp_path: Path) -> None:
    with pytest.raises(ConnectionRefused, match=r"^PIPELINE_KAFKA_SSL_CA_LOCATION: the Kafka client cannot be created"):
        connect_check(_settings(kafka_secure, **{"ssl.ca.location": str(tmp_path / "missing.pem")}), timeout_s=5)
