"""Sentinel credentials given the ordinary way (PIPELINE_KAFKA_*, PIPELINE_SPARK_KAFKA_*, PIPELINE_POSTGRES_DSN) to
every process the project starts appear nowhere: not in the logs at DEBUG (librdkafka's configuration dump
included), the /metrics body, an error message, or any process's command line (/proc/*/cmdline, what `ps` shows)
while a supervised service (`pipeline run --workers 2`: supervisor and children) and the compaction job under
spark-submit run. The broker here is PLAINTEXT, so the credentials are carried and never used:
tests/security/test_no_secret_leaks.py uses real ones on the secured broker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.testing import inputs
from pipeline.testing.drain import committed_offsets
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOTALS = "pipeline.examples.running_totals:app"
SENTINEL = f"SENTINEL-{uuid.uuid4().hex[:12]}"
PARTITIONS = 2
RECORDS = 400


class CommandLines:
    """Every process's command line on the machine, sampled until stopped: which held the sentinel, and which ran."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for path in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:  # gone meanwhile
                    continue

    def holding(self, secret: str) -> list[str]:
        return [line for line in self.seen if secret in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(kafka_bootstrap: str) -> Iterator[dict[str, str]]:
    suffix = f"-{uuid.uuid4().hex[:8]}"
    inputs.create_topics(kafka_bootstrap, {f"totals-input{suffix}": PARTITIONS, f"totals-output{suffix}": PARTITIONS})
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    yield clean | {
        "PYTHONPATH": str(ROOT),  # Spark's Python workers too
        "PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PIPELINE_APP_ID": f"secrets{suffix}",
        "PIPELINE_TOPIC_SUFFIX": suffix,
        "PIPELINE_KAFKA_SASL_PASSWORD": f"{SENTINEL}-sasl",
        "PIPELINE_KAFKA_SSL_KEY_PASSWORD": f"{SENTINEL}-key",
        "PIPELINE_KAFKA_DEBUG": "conf",  # librdkafka prints its configuration
        "PIPELINE_POSTGRES_DSN": f"postgresql://pipeline:{SENTINEL}-dsn@127.0.0.1:1/pipeline",
        "PIPELINE_SPARK_KAFKA_SASL_JAAS_CONFIG": f'x required username="u" password="{SENTINEL}-jaas";',
    }


def run_supervised(env: dict[str, str], port: int) -> tuple[str, str]:
    """`pipeline run --workers 2` until it caught up with the input; its log and its /metrics body."""
    counts = inputs.produce_running_totals(
        env["PIPELINE_BOOTSTRAP_SERVERS"], f"totals-input{env['PIPELINE_TOPIC_SUFFIX']}", RECORDS, partitions=PARTITIONS
    )
    command = [sys.executable, "-m", "pipeline", "--log-level", "debug", "run", TOTALS, "--workers", "2"]
    service = subprocess.Popen(
        [*command, "--metrics-port", str(port)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        group, topic = env["PIPELINE_APP_ID"], f"totals-input{env['PIPELINE_TOPIC_SUFFIX']}"
        config = {"bootstrap.servers": env["PIPELINE_BOOTSTRAP_SERVERS"]}
        eventually(lambda: committed_offsets(config, group, topic, range(PARTITIONS), 10) == counts, 120, 0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        service.send_signal(signal.SIGTERM)
        _, log = service.communicate(timeout=90)
    assert service.returncode == 0, log[-3000:]
    return log, metrics


def spark_submit(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The compaction job as a scheduler launches it: spark-submit snapshots/submit.py, credentials in the
    environment (the app id and brokers too)."""
    from snapshots.spark_session import kafka_connector_jars

    spark_env = env | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]"]
    command += ["--jars", kafka_connector_jars(), str(ROOT / "snapshots" / "submit.py"), "--timeout", "30"]
    return subprocess.run(command, cwd=ROOT, env=spark_env, capture_output=True, text=True, timeout=300)


def failing_commands(env: dict[str, str]) -> str:
    """Errors the credentials could ride on: a database that does not answer, a broker that does not."""
    verify = subprocess.run(
        [sys.executable, "-m", "pipeline", "verify", TOTALS, "--sink", "postgres", "--timeout", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    nowhere = env | {"PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PIPELINE_CONNECT_TIMEOUT_MS": "1000"}
    compact = subprocess.run(
        [sys.executable, "-m", "snapshots.cli", "--log-level", "debug", "compact"],
        cwd=ROOT,
        env=nowhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 2 and "127.0.0.1" in verify.stderr, verify.stderr
    assert compact.returncode == 2 and "BOOTSTRAP_SERVERS" in compact.stderr, compact.stderr
    return verify.stdout + verify.stderr + compact.stdout + compact.stderr


@pytest.mark.spark
def test_sentinel_credentials_appear_in_no_log_metric_error_or_command_line(env: dict[str, str]) -> None:
    with CommandLines() as command_lines:
        log, metrics = run_supervised(env, free_port())
        job = spark_submit(env)
        errors = failing_commands(env)

    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    assert "compaction: 2 published" in job.stdout, job.stdout
    assert "sasl.password = [redacted]" in log  # librdkafka's configuration dump was on, through logging
    assert any("pipeline.worker --supervisor" in line for line in command_lines.seen)  # the children were seen
    assert any("snapshots/submit.py" in line for line in command_lines.seen)  # and the job
    shown = {"log": log, "metrics": metrics, "job output": job.stdout + job.stderr, "errors": errors}
    for where, text in shown.items():
        assert SENTINEL not in text, f"a sentinel credential appears in the {where}"
    assert command_lines.holding(SENTINEL) == []
