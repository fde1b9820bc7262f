"""`pipeline verify` and `pipeline chaos` pick the sink as `pipeline run` does: the option, else PIPELINE_SINK."""

from __future__ import annotations

import pytest

from pipeline.settings import ConfigError
from pipeline.testing.postgres_checker import Tables, chosen_tables

DSN = "postgresql://u:secret@db:5432/d"


@pytest.fixture(autouse=True)
def no_pipeline_env(monkeypatch) -> None:
    for name in ("PIPELINE_SINK", "PIPELINE_POSTGRES_DSN", "PIPELINE_POSTGRES_SCHEMA", "PIPELINE_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_kafka_unless_told_otherwise() -> None:
    assert chosen_tables(None, None, None) is None


def test_the_environment_of_pipeline_run_selects_the_tables(monkeypatch) -> None:
    monkeypatch.setenv("PIPELINE_SINK", "postgres")
    monkeypatch.setenv("PIPELINE_POSTGRES_DSN", DSN)
    assert chosen_tables(None, None, None) == Tables(DSN, "public")
    assert chosen_tables(None, None, "mine") == Tables(DSN, "mine")
    assert chosen_tables("kafka", None, None) is None  # the option wins
    assert "secret" not in repr(chosen_tables(None, None, None))


def test_postgres_without_a_dsn_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="POSTGRES_DSN is empty"):
        chosen_tables("postgres", None, None)
