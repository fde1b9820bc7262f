"""A small local SparkSession with Spark's Kafka connector on its classpath.

The connector's jars come from the environment variable SPARK_KAFKA_JARS (comma-separated paths or globs) when it is
set, otherwise from `deploy/local/spark.sh classpath`, which resolves them from Maven Central once and caches them.
Either way they must be built for the Spark version of the pyspark running (checked).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

JARS_ENV = "SPARK_KAFKA_JARS"
SPARK_SH = Path(__file__).resolve().parent.parent / "deploy" / "local" / "spark.sh"
CLASSPATH_TIMEOUT_S = 600
# spark-sql-kafka-0-10_2.13-4.2.0.jar, spark-token-provider-kafka-0-10_2.13-4.2.0.jar: the Spark version they are for.
CONNECTOR_JAR = re.compile(r"^spark-(?:sql-kafka|token-provider-kafka)-0-10_[0-9.]+-(?P<version>[^/]+)\.jar$")

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
    """Comma-separated paths of the Kafka connector's jars, suitable for `spark.jars`, checked against this pyspark."""
    from_env = os.environ.get(JARS_ENV, "").strip()
    if from_env:
        jars = from_env
    elif SPARK_SH.is_file():
        jars = _run_spark_sh_classpath()
    else:
        raise RuntimeError(f"{SPARK_SH} not found; set {JARS_ENV} to the Kafka connector's jars (comma-separated)")
    check_connector_version(jars, pyspark.__version__)
    return jars


def check_connector_version(jars: str, spark_version: str) -> None:
    """The connector and its token provider are built against one Spark version; with another one the job fails late,
    mid-read (NoSuchMethodError, or a missing class when it first needs a delegation token): refuse at start-up."""
    for entry in filter(None, (jar.strip() for jar in jars.split(","))):
        for path in sorted(glob.glob(entry)) or [entry]:  # spark.jars takes globs (the compaction image uses one)
            match = CONNECTOR_JAR.match(os.path.basename(path))
            if match and match["version"] != spark_version:
                raise RuntimeError(
                    f"{path} is built for Spark {match['version']}, but pyspark is {spark_version}: {JARS_ENV} must "
                    f"name the connector jars of Spark {spark_version} (deploy/local/spark.sh classpath resolves them)"
                )


def _run_spark_sh_classpath() -> str:
    try:
        # PYSPARK_VERSION: the connector for the pyspark of this interpreter, which need not be .venv's.
        result = subprocess.run(
            [str(SPARK_SH), "classpath"],
            capture_output=True,
            text=True,
            check=True,
            timeout=CLASSPATH_TIMEOUT_S,
            env={**os.environ, "PYSPARK_VERSION": pyspark.__version__},
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
