"""No secret leaves the process: the SCRAM passwords, a SASL JAAS line, a key password and PostgreSQL DSN passwords
never appear in what a run shows, at DEBUG too (the processes' logs, with librdkafka's own debug output), in the
/metrics, /ready and /live bodies, in the error a failing start prints, or in a printed or logged Settings.

The secured broker keeps the passwords it was first started with, so the real SCRAM passwords are needles here
(they must be used, and never shown); everything else is a sentinel made for this test: the PostgreSQL role's
password of a successful run, and the wrong password, key password and JAAS line of failing ones. The compaction
job's output is checked by test_compaction_least_privilege.py the same way."""

from __future__ import annotations

import dataclasses
import logging
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit

import pytest

from pipeline import settings as settings_module
from pipeline.kafka.acls import pipeline_acls, postgres_acls
from pipeline.testing.harness import Fleet
from tests.faults.conftest import assert_exactly_once
from tests.security.conftest import PIPELINE, names_of, refused_start, service_config, totals_records
from tests.support import eventually

pytestmark = [pytest.mark.secure, pytest.mark.postgres]
SENTINEL = f"SENTINEL-{uuid.uuid4().hex[:12]}"
LIBRDKAFKA_DEBUG = "conf,security,broker"  # librdkafka prints its configuration and the SASL exchange
START_BOUND_S = 20


def needles(kafka_secure, *extra: str) -> dict[str, str]:
    found = {f"SCRAM password of {user}": password for user, password in kafka_secure.passwords.items()}
    return found | {f"sentinel {i}": value for i, value in enumerate(extra)}


def assert_nothing_shows(secrets: dict[str, str], **texts: str) -> None:
    for where, text in texts.items():
        assert text, f"{where}: nothing captured (the check would prove nothing)"
        for what, secret in secrets.items():
            assert secret not in text, f"{what} appears in {where}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_bodies(port: int) -> dict[str, str]:
    def get(path: str) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.read().decode()
        except urllib.error.HTTPError as e:  # /ready answers 503 while restoring
            return e.read().decode()
        except urllib.error.URLError:  # not listening yet
            return ""

    eventually(lambda: "pipeline_records_in_total" in get("/metrics"), 30, 0.5)
    return {"/metrics": get("/metrics"), "/ready": get("/ready"), "/live": get("/live")}


def logs(fleet: Fleet) -> str:
    return "\n".join(i.log_path.read_text(errors="replace") for i in fleet.instances)


def test_a_kafka_sink_run_at_debug_shows_no_secret(kafka_secure, secure_run, grants) -> None:
    port = free_port()
    run = secure_run(log_level="debug", metrics_port=port, kafka_debug=LIBRDKAFKA_DEBUG)
    grants.grant(PIPELINE, pipeline_acls(names_of(run)))
    run.feed(totals_records(2_000, seed=51), seconds=4)
    fleet = run.start(1)
    bodies = http_bodies(port)
    outcome = run.finish()

    assert_exactly_once(outcome)
    text = logs(fleet)
    assert "sasl.password = [redacted]" in text  # librdkafka's debug output was on (it prints its configuration)
    assert all(i.process.args[2:5] == ["pipeline", "--log-level", "debug"] for i in fleet.instances)
    assert_nothing_shows(needles(kafka_secure), log=text, **bodies)


def test_a_postgres_sink_run_at_debug_shows_no_dsn_password(kafka_secure, secure_pg_run, grants) -> None:
    port = free_port()
    run = secure_pg_run(log_level="debug", metrics_port=port, kafka_debug=LIBRDKAFKA_DEBUG)
    grants.grant(PIPELINE, postgres_acls(run.names))
    run.feed(totals_records(2_000, seed=52), seconds=3)
    fleet = run.start(1)
    bodies = http_bodies(port)
    verdict = run.finish()

    assert verdict.ok, verdict.summary()
    dsn_password = urlsplit(run.dsn).password
    assert dsn_password.startswith("SENTINEL-pg-")
    assert_nothing_shows(needles(kafka_secure, dsn_password), log=logs(fleet), **bodies)


def failing_start(run) -> str:
    return refused_start(run, START_BOUND_S, "a start with a bad secret")


@pytest.fixture(scope="module")
def encrypted_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A client key whose password is not the sentinel given for it."""
    directory = tmp_path_factory.mktemp("client-key")
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
            str(directory / "client.key"),
            "-out",
            str(directory / "client.pem"),
            "-passout",
            "pass:not-the-sentinel",
        ],
        check=True,
        capture_output=True,
    )
    return str(directory / "client.key"), str(directory / "client.pem")


@pytest.mark.parametrize("case", ["wrong-password", "key-password", "jaas"])
def test_a_failing_start_names_the_setting_and_shows_no_secret(
    case: str, kafka_secure, secure_run, grants, encrypted_key: tuple[str, str]
) -> None:
    secret = f"{SENTINEL}-{case}"
    overrides, expected = {
        "wrong-password": ({"sasl.password": secret}, "PIPELINE_KAFKA_SASL_PASSWORD"),
        "key-password": (
            {
                "ssl.key.location": encrypted_key[0],
                "ssl.certificate.location": encrypted_key[1],
                "ssl.key.password": secret,
            },
            "PIPELINE_KAFKA_SSL_KEY_PASSWORD",
        ),
        "jaas": (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="pipeline" password="{secret}";'
            },
            "PIPELINE_KAFKA_SASL_JAAS_CONFIG",
        ),
    }[case]
    run = secure_run(log_level="debug", service=service_config(kafka_secure, **overrides), kafka_debug=LIBRDKAFKA_DEBUG)
    grants.grant(PIPELINE, pipeline_acls(names_of(run)))

    text = failing_start(run)

    assert f"configuration error: {expected}" in text or f"/ {expected}:" in text, text
    assert_nothing_shows(needles(kafka_secure, secret), log=text)


def test_a_wrong_dsn_password_shows_neither_it_nor_the_kafka_ones(kafka_secure, secure_pg_run, grants) -> None:
    run = secure_pg_run(log_level="debug")
    secret = f"{SENTINEL}-dsn"
    url = urlsplit(run.dsn)
    run.dsn = run.dsn.replace(f":{url.password}@", f":{secret}@")
    grants.grant(PIPELINE, postgres_acls(run.names))

    text = failing_start(run)

    assert "password authentication failed" in text, text
    assert_nothing_shows(needles(kafka_secure, secret, url.password), log=text)


def test_settings_printed_logged_or_raised_show_no_secret(kafka_secure, caplog: pytest.LogCaptureFixture) -> None:
    dsn = f"postgresql://pipeline:{SENTINEL}-dsn@127.0.0.1:1/db"
    env = {
        "PIPELINE_POSTGRES_DSN": dsn,
        "PIPELINE_KAFKA_SASL_PASSWORD": kafka_secure.passwords["pipeline"],
        "PIPELINE_KAFKA_SSL_KEY_PASSWORD": f"{SENTINEL}-key",
        "PIPELINE_KAFKA_SASL_JAAS_CONFIG": f'x required password="{SENTINEL}-jaas";',
        "PIPELINE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": f"{SENTINEL}-oauth",
    }
    settings = settings_module.load(env=env)
    caplog.set_level("DEBUG")
    logging.getLogger("pipeline").debug("settings %s %r; kafka %s", settings, settings, settings.kafka)
    with pytest.raises(settings_module.ConfigError) as bad:
        settings_module.load(env={**env, "PIPELINE_SINK": "postgres", "PIPELINE_POSTGRES_SCHEMA": ""})

    assert settings.kafka["sasl.password"] == kafka_secure.passwords["pipeline"]  # the clients get the real value
    secrets = needles(kafka_secure, f"{SENTINEL}-dsn", f"{SENTINEL}-key", f"{SENTINEL}-jaas", f"{SENTINEL}-oauth")
    assert_nothing_shows(
        secrets,
        repr=repr(settings),
        str=str(settings),
        asdict=repr(dataclasses.asdict(settings)),
        redacted=str(settings.redacted_kafka()),
        log=caplog.text,
        error=str(bad.value),
    )
