"""README's `make demo` on a truly fresh machine (deploy/image/fresh.sh): a container of the bare Debian base image,
with no JDK, Maven, PostgreSQL, virtualenv or Kafka, in its own network namespace; a clean clone of the committed
HEAD; setup installs what is missing and the demo ends with the checker's clean verdict.

Slow (minutes: it downloads a JDK, Maven, PostgreSQL, pyspark, the Kafka and Spark jars, and builds the Schema
Registry) and skipped, with the reason, where no container engine can run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.image.containers import FRESH_SH

FRESH_TIMEOUT_S = 2400


@pytest.mark.image
@pytest.mark.slow
@pytest.mark.timeout(FRESH_TIMEOUT_S + 900)
def test_make_demo_on_a_fresh_machine_installs_what_is_missing_and_ends_clean(engine, tmp_path: Path):
    log_path = tmp_path / "fresh-demo.log"
    result = subprocess.run(
        [str(FRESH_SH)],
        capture_output=True,
        text=True,
        timeout=FRESH_TIMEOUT_S,
        env={**os.environ, "EOS_FRESH_LOG": str(log_path)},
    )
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    assert result.returncode == 0, result.stderr[-4000:]
    assert "installing Debian packages: openjdk-17-jdk-headless maven postgresql" in log, log[-4000:]
    assert "creating .venv" in log
    assert "exactly-once: OK" in log, log[-4000:]
    assert "postgres: running" in log, log[-4000:]
