"""Spark's Kafka connector follows pyspark: one version, pyspark's (pinned in requirements/), from which
deploy/local/spark.sh and the Dockerfile resolve the connector and its token provider; a job given jars of another
Spark refuses to start, naming the jar."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pyspark
import pytest

from snapshots.spark_session import JARS_ENV, check_connector_version, kafka_connector_jars

REPO = Path(__file__).resolve().parents[2]


def jars(directory: Path, *names: str) -> str:
    for name in names:
        (directory / name).write_bytes(b"")
    return f"{directory}/*.jar"


def test_a_token_provider_of_another_spark_is_refused_naming_the_jar_and_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = pyspark.__version__
    glob = jars(
        tmp_path,
        f"spark-sql-kafka-0-10_2.13-{spark}.jar",
        "spark-token-provider-kafka-0-10_2.13-4.0.0.jar",  # what main resolved for Spark 4.2.0
        "kafka-clients-3.9.2.jar",
    )
    monkeypatch.setenv(JARS_ENV, glob)
    with pytest.raises(RuntimeError, match=rf"token-provider.*4\.0\.0\.jar is built for Spark 4\.0\.0.*{JARS_ENV}"):
        kafka_connector_jars()


def test_jars_of_the_running_spark_pass_whatever_their_other_dependencies(tmp_path: Path) -> None:
    spark = pyspark.__version__
    listed = ",".join(
        str(tmp_path / name)
        for name in (f"spark-sql-kafka-0-10_2.13-{spark}.jar", f"spark-token-provider-kafka-0-10_2.13-{spark}.jar")
    )
    check_connector_version(f"{listed},{jars(tmp_path, 'kafka-clients-3.9.2.jar', 'commons-pool2-2.13.1.jar')}", spark)
    with pytest.raises(RuntimeError, match=re.escape("spark-sql-kafka-0-10_2.13-4.1.0.jar is built for Spark 4.1.0")):
        check_connector_version(f"{listed},/opt/x/spark-sql-kafka-0-10_2.13-4.1.0.jar", spark)


def pinned(lock: str, name: str) -> str:
    found = re.search(rf"^{name}==([^\s;\\]+)", (REPO / "requirements" / lock).read_text(), re.M)
    assert found, f"requirements/{lock} does not pin {name}"
    return found[1]


def test_the_locks_pin_the_installed_pyspark_and_the_image_resolves_the_connector_for_it() -> None:
    assert pinned("dev.txt", "pyspark") == pinned("compaction.txt", "pyspark") == pyspark.__version__
    dockerfile = (REPO / "Dockerfile").read_text()
    derive = re.search(r'SPARK_VERSION="\$\((sed .*? compaction\.txt)\)"', dockerfile)
    assert derive, "the Dockerfile no longer derives SPARK_VERSION from the compaction lock"
    result = subprocess.run(["sh", "-c", derive[1]], cwd=REPO / "requirements", capture_output=True, text=True)
    assert result.stdout.strip() == pyspark.__version__, result
    assert '-Dspark.version="$SPARK_VERSION"' in dockerfile
    assert "SPARK_VERSION" not in (REPO / "deploy" / "versions.env").read_text().replace("# ", "")
