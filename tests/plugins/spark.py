"""One local SparkSession (with Spark's Kafka connector) for the whole test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Every Spark job of the tests (this session, and the `snapshots` commands tests start as processes, which inherit the
# environment) is a JVM living under a minute on a few thousand records: the optimising compiler's start-up work is
# most of what it costs. Compiling with the first tier alone, test_snapshot_pipeline.py used 45-47 CPU-seconds in all
# against 64-69 (2026-11-29, two runs each), on a CI machine where every lane waits for CPU. Deployed jobs keep the
# JVM's default; a value set outside the tests wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Imported here so that loading this plugin costs nothing for test runs that never ask for Spark.
    from snapshots.spark_session import local_spark_session

    session = local_spark_session("eos-pipeline-tests")
    yield session
    session.stop()
