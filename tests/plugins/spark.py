"""One local SparkSession (with Spark's Kafka connector) for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Imported here so that loading this plugin costs nothing for test runs that never ask for Spark.
    from snapshots.spark_session import local_spark_session

    session = local_spark_session("eos-pipeline-tests")
    yield session
    session.stop()
