"""A small local SparkSession with Spark's Kafka connector on its classpath.

The connector's jars come from the environment variable SPARK_KAFKA_JARS (comma-separated paths) when it is set,
otherwise from `deploy/local/spark.sh classpath`, which resolves them from Maven Central once and caches them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

JARS_ENV = "SPARK_KAFKA_JARS"
SPARK_SH = Path(__file__).resolve().parent.parent / "deploy" / "local" / "spark.sh"
CLASSPATH_TIMEOUT_S = 600

LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}


def kafka_connector_jars() -> str:
    """Comma-separated paths of the Kafka connector's jars, suitable for `spark.jars`."""
    from_env = os.environ.get(JARS_ENV, "").strip()
    if from_env:
        return from_env
    if not SPARK_SH.is_file():
        raise RuntimeError(f"{SPARK_SH} not found; set {JARS_ENV} to the Kafka connector's jars (comma-separated)")
    return _run_spark_sh_classpath()


def _run_spark_sh_classpath() -> str:
    try:
        result = subprocess.run(
            [str(SPARK_SH), "classpath"], capture_output=True, text=True, check=True, timeout=CLASSPATH_TIMEOUT_S
        )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{SPARK_SH} classpath failed:\n{exc.stderr.strip()}") from exc
    jars = result.stdout.strip()
    if not jars:
        raise RuntimeError(f"{SPARK_SH} classpath printed no jars:\n{result.stderr.strip()}")
    return jars


def local_spark_session(app_name: str, master: str = "local[2]") -> SparkSession:
    """A SparkSession for tests and the local compaction job: Kafka connector, few partitions, no UI, quiet logs.

    Static settings such as `spark.jars` only take effect in the first session of a process: stop any earlier
    session (`SparkSession.getActiveSession()`) first if it was built without the connector.
    """
    # Bind the driver to loopback instead of warning that the hostname resolves to it and picking another interface.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers run the driver's interpreter (the venv, with pyarrow for mapInArrow), not whatever is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master).config("spark.jars", kafka_connector_jars())
    for key, value in LOCAL_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
