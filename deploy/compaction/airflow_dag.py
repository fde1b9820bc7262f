"""Airflow DAG: the compaction job of one app, hourly, one run at a time, with a check of the result.

Copy into the DAGs folder of a deployment whose workers have the project installed (`pip install ".[spark]"`) and a
JRE; SPARK_KAFKA_JARS names the connector jars (deploy/local/spark.sh classpath prints them). The job exits 0 when
every partition was published or skipped (nothing new, or another run was first), 1 when one failed (e.g. its
changelog no longer reaches its snapshot): then the task fails and alerts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

APP_ID = "running-totals"
BOOTSTRAP = "kafka-bootstrap.kafka.svc:9092"

with DAG(
    dag_id=f"{APP_ID}-compaction",
    schedule="17 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,  # a compaction covers everything up to now: missed runs need no backfill
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "execution_timeout": timedelta(hours=1)},
    tags=["eos-pipeline", "kafka", "spark"],
) as dag:
    compact = BashOperator(
        task_id="compact",
        bash_command=(f"snapshots compact --bootstrap-servers {BOOTSTRAP} --app-id {APP_ID} --master 'local[2]'"),
    )
    show = BashOperator(
        task_id="show",
        bash_command=f"snapshots show --bootstrap-servers {BOOTSTRAP} --app-id {APP_ID}",
    )
    compact >> show
