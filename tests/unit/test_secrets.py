"""Secrets in settings and in the compaction job's options: a redacting JSON-ready form of the settings, and no
credential accepted on a command line (`ps` shows it to every local user)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import settings as settings_module
from pipeline.settings import ConfigError
from snapshots.options import spark_kafka_properties

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "SENTINEL-c0ffee"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://pipeline:{SENTINEL}@db.example:5432/pipeline",
        f"host=db.example password={SENTINEL} user=pipeline",
    ],
    ids=["uri", "keywords"],
)
def test_settings_redacted_is_json_ready_and_holds_no_secret(dsn: str) -> None:
    env = {
        "PIPELINE_POSTGRES_DSN": dsn,
        "PIPELINE_KAFKA_SASL_PASSWORD": f"{SENTINEL}-sasl",
        "PIPELINE_KAFKA_SSL_KEY_PASSWORD": f"{SENTINEL}-key",
        "PIPELINE_KAFKA_BASIC_AUTH_USER_INFO": f"registry:{SENTINEL}-registry",
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_SCHEMA_REGISTRY_URL": "https://registry.example:8081",
        "PIPELINE_SCHEMA_REGISTRY_USER_INFO": f"registry:{SENTINEL}-schema-registry",
    }
    settings = settings_module.load(env=env)

    shown = {"json": json.dumps(settings.redacted()), "repr": repr(settings), "str": str(settings)}

    for where, text in shown.items():
        assert SENTINEL not in text, where
    assert settings.redacted()["kafka"]["security.protocol"] == "SASL_SSL"
    assert "db.example" in settings.redacted()["postgres_dsn"] and "***" in settings.redacted()["postgres_dsn"]
    assert str(settings.kafka["basic.auth.user.info"]).endswith("-registry")  # the clients get the real value
    assert settings.redacted()["schema_registry_user_info"] == "***"
    assert str(settings.schema_registry_user_info).endswith("-schema-registry")


@pytest.mark.parametrize(
    "option",
    [f"--kafka=sasl.password={SENTINEL}", f'--spark-kafka=sasl.jaas.config=x required password="{SENTINEL}";'],
    ids=["librdkafka", "java"],
)
def test_a_credential_on_the_compaction_command_line_is_refused_without_showing_it(option: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")} | {"PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "snapshots", "compact", "--app-id", "a", option],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2, result.stderr
    assert "a secret on the command line is visible to every local user" in result.stderr
    assert SENTINEL not in result.stdout + result.stderr


def test_spark_kafka_properties_come_from_the_environment_and_an_owner_only_file(tmp_path: Path) -> None:
    env = {"PIPELINE_SPARK_KAFKA_SASL_JAAS_CONFIG": f'x password="{SENTINEL}";', "PIPELINE_APP_ID": "a"}
    config = tmp_path / "spark-kafka.properties"
    config.write_text("security.protocol=SASL_SSL\nssl.truststore.type=PEM\n")
    config.chmod(0o600)

    properties = spark_kafka_properties(env, str(config))
    config.chmod(0o644)

    assert properties["sasl.jaas.config"] == f'x password="{SENTINEL}";' and SENTINEL not in repr(properties)
    assert properties["security.protocol"] == "SASL_SSL"
    assert settings_module.load(env=env).app_id == "a"  # the loader leaves PIPELINE_SPARK_KAFKA_* to the job
    with pytest.raises(ConfigError, match=r"readable by others \(mode 644\); chmod 600"):
        spark_kafka_properties({}, str(config))
