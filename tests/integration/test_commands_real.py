"""The commands against a real broker: `pipeline topics create` fails loudly when the broker refuses a topic, and
`pipeline verify` reads the settings `pipeline run` read (PIPELINE_APP_ID, the topic suffix), so a clean run under
a custom app id is judged clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipeline.testing import inputs
from pipeline.testing.drain import committed_offsets
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOTALS = "pipeline.examples.running_totals:app"
PARTITIONS = 3
RECORDS = 600


def command_env(bootstrap: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return env | {"PYTHONPATH": str(ROOT), "PIPELINE_BOOTSTRAP_SERVERS": bootstrap} | settings


def pipeline(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def test_topics_create_exits_1_naming_the_topic_the_broker_refused(kafka_bootstrap: str) -> None:
    env = command_env(kafka_bootstrap)
    name = f"refused-{uuid.uuid4().hex[:8]}"

    refused = pipeline(env, "topics", "create", f"{name}:1", "--replication-factor", "5")  # one broker here
    created = pipeline(env, "topics", "create", f"{name}:2")
    again = pipeline(env, "topics", "create", f"{name}:2")

    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and line.startswith(f"pipeline topics: cannot create '{name}' ("), line
    assert "eplication factor" in line, line
    assert (created.returncode, created.stdout) == (0, f"created {name}\n"), created.stderr
    assert (again.returncode, again.stdout) == (0, f"exists  {name}\n"), again.stderr


@pytest.fixture
def custom_run(kafka_bootstrap: str) -> dict[str, str]:
    """A clean run of running-totals under PIPELINE_APP_ID (not the App's name), on topics of its own."""
    suffix = f"-{uuid.uuid4().hex[:8]}"
    env = command_env(kafka_bootstrap, PIPELINE_APP_ID=f"desk{suffix}", PIPELINE_TOPIC_SUFFIX=suffix)
    inputs.create_topics(kafka_bootstrap, {f"totals-input{suffix}": PARTITIONS, f"totals-output{suffix}": PARTITIONS})
    counts = inputs.produce_running_totals(kafka_bootstrap, f"totals-input{suffix}", RECORDS, partitions=PARTITIONS)
    service = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", TOTALS], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        config = {"bootstrap.servers": kafka_bootstrap}

        def caught_up() -> bool:
            offsets = committed_offsets(config, f"desk{suffix}", f"totals-input{suffix}", range(PARTITIONS), 10)
            return offsets == counts

        eventually(caught_up, 90, 0.5)
    finally:
        service.send_signal(signal.SIGTERM)
        _, stderr = service.communicate(timeout=60)
    assert service.returncode == 0, stderr[-3000:]
    return env


def test_verify_reads_the_app_id_and_suffix_pipeline_run_read(custom_run: dict[str, str]) -> None:
    result = pipeline(custom_run, "verify", TOTALS, "--timeout", "30")

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"exactly-once: OK  (inputs {RECORDS}, outputs {RECORDS},"), result.stdout
