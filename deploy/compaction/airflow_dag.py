"""Airflow DAG: the compaction job of one app, hourly, one run at a time, with a check of the result.

Copy into the DAGs folder of an Airflow 3 deployment (tested with the versions of requirements/airflow.txt:
tests/infra/test_airflow_dag.py runs it with `airflow dags test` against a real broker and Spark). The job runs as
`python -m snapshots` with the interpreter of an environment that has the project installed (`pip install
".[spark]"`) and a JRE: EOS_PIPELINE_PYTHON names it (default: Airflow's own interpreter, when the project is installed
beside Airflow). A separate environment is the better choice: Airflow's dependencies and pyspark's then never have to
agree. SPARK_KAFKA_JARS names the connector's jars (deploy/local/spark.sh classpath prints them; the compaction image
sets it); the job refuses jars of another Spark version.

PIPELINE_APP_ID and PIPELINE_BOOTSTRAP_SERVERS, the service's own settings, choose the app and the cluster. Credentials
reach the job through the workers' environment, never through this file or a command line.

The job exits 0 when every partition was published or skipped (nothing new, or another run was first), 1 when one
failed (e.g. its changelog no longer reaches its snapshot): then the task fails and alerts.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

APP_ID = os.environ.get("PIPELINE_APP_ID", "running-totals")
BOOTSTRAP = os.environ.get("PIPELINE_BOOTSTRAP_SERVERS", "kafka-bootstrap.kafka.svc:9092")
SNAPSHOTS = f"{shlex.quote(os.environ.get('EOS_PIPELINE_PYTHON', sys.executable))} -m snapshots"
TARGET = f"--bootstrap-servers {shlex.quote(BOOTSTRAP)} --app-id {shlex.quote(APP_ID)}"

with DAG(
    dag_id=f"{APP_ID}-compaction",
    schedule="17 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,  # a compaction covers everything up to now: missed runs need no backfill
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "execution_timeout": timedelta(hours=1)},
    tags=["eos-pipeline", "kafka", "spark"],
) as dag:
    compact = BashOperator(task_id="compact", bash_command=f"{SNAPSHOTS} compact {TARGET} --master 'local[2]'")
    show = BashOperator(task_id="show", bash_command=f"{SNAPSHOTS} show {TARGET}")
    compact >> show
