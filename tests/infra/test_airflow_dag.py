"""The Airflow DAG of deploy/compaction/ run for real: `airflow dags test` in Airflow's own virtualenv
(deploy/local/airflow.sh venv: requirements/airflow.txt, installed on first use and cached per lock) against the test
broker. Its compact task runs the Spark job with this project's interpreter (EOS_PIPELINE_PYTHON), its show task lists
the result; the snapshot it published is read back with the runtime's own restore."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from pipeline.serde import JsonSerde
from snapshots.spark_session import kafka_connector_jars
from tests.snapshots.helpers import Changelog, new_app, restore

# The module's DAG run (its fixture: `airflow db migrate`, then `airflow dags test` starting Spark) takes about a minute
# alone, but up to four beside CI's other lanes on two cores; CI of 2026-11-29 passed the suite's 300 s per test while
# the run was still going. Each airflow call keeps its own 900 s limit below.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "deploy" / "compaction"
DAG_FILE = DAGS / "airflow_dag.py"
PARTITIONS = 2
MONEY = JsonSerde(decimal=True)
AMOUNTS = {"acct-1": Decimal("12345678901234567890.10"), "acct-2": Decimal("0.000"), "acct-3": Decimal("-7.5E+3")}

# A failed task would wait the DAG's retry_delay (5 minutes) twice before the run fails: the test turns retries off
# the way a deployment would, with a cluster policy, and runs the DAG file itself unchanged.
NO_RETRIES = "def task_policy(task):\n    task.retries = 0\n"


@dataclass
class DagRun:
    log: Changelog
    returncode: int
    output: str
    states: dict[str, str]  # task_id -> final state

    def explain(self, lines: int = 40) -> str:
        tail = "\n".join(self.output.splitlines()[-lines:])
        return f"tasks {self.states}, airflow exited {self.returncode}; its output ends:\n{tail}"


@pytest.fixture(scope="module")
def airflow_venv() -> Path:
    """Installs Airflow on first use: CI from a clean clone needs nothing more. Without PyPI it fails, never skips."""
    env = dict(os.environ)
    env.setdefault("UV", str(Path(sys.executable).with_name("uv")))  # make setup installs uv beside this python
    proc = subprocess.run(
        [REPO / "deploy" / "local" / "airflow.sh", "venv"], env=env, capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        pytest.fail(
            f"deploy/local/airflow.sh venv could not install Airflow from requirements/airflow.txt (is PyPI "
            f"reachable?):\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return Path(proc.stdout.strip())


def airflow(venv: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv / "bin" / "airflow", *args], env=env, capture_output=True, text=True, timeout=900, cwd=env["AIRFLOW_HOME"]
    )


def airflow_env(home: Path, bootstrap: str, app_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        # The DAG's own settings, as a deployment sets them on its workers.
        EOS_PIPELINE_PYTHON=sys.executable,
        PIPELINE_APP_ID=app_id,
        PIPELINE_BOOTSTRAP_SERVERS=bootstrap,
        SPARK_KAFKA_JARS=kafka_connector_jars(),
        # The job's Python (and Spark's Python workers) import this checkout's code, not another editable install's.
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


def write_history(log: Changelog) -> None:
    """Partition 0: random changes with deletes and aborted transactions; partition 1: exact decimal amounts."""
    log.random_history(random.Random(20), 12, 60, only=[0])
    log.transaction(1, {key: MONEY.serialize(amount) for key, amount in AMOUNTS.items()})
    log.transaction(1, {"acct-gone": b"1"})
    log.transaction(1, {"acct-gone": None})


@pytest.fixture(scope="module")
def dag_run(airflow_venv: Path, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> DagRun:
    log = new_app(AdminClient({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap, PARTITIONS, prefix="airflow")
    write_history(log)
    home = tmp_path_factory.mktemp("airflow-home")
    (home / "config").mkdir()
    (home / "config" / "airflow_local_settings.py").write_text(NO_RETRIES)
    env = airflow_env(home, kafka_bootstrap, log.app_id)
    migrate = airflow(airflow_venv, env, "db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    run = airflow(airflow_venv, env, "dags", "test", f"{log.app_id}-compaction")
    with closing(sqlite3.connect(home / "airflow.db")) as db:  # the run's own record of its tasks
        rows = db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = ?", (f"{log.app_id}-compaction",))
        states = dict(rows.fetchall())
    return DagRun(log, run.returncode, run.stdout + run.stderr, states)


def test_the_dag_compacts_the_changelog_into_a_snapshot_equal_to_its_fold(dag_run: DagRun) -> None:
    """Both tasks succeed, and each partition restores from the snapshot the run published alone (no changelog record
    read after it) to exactly the fold of the changelog: aborted changes left out, deletes applied, decimals exact."""
    assert dag_run.states == {"compact": "success", "show": "success"}, dag_run.explain()
    assert dag_run.returncode == 0, dag_run.explain()
    log = dag_run.log
    states = {}
    for p in range(PARTITIONS):
        states[p], job = restore(log.bootstrap, log.app_id, p, log.committed(p))
        assert job.snapshot is not None and job.records == 0, f"p{p}: not restored from a new snapshot"
        assert states[p] == log.folds[p], f"p{p}"
        # The show task listed it: the first generation, with every entry of the fold.
        assert f"generation 1: {len(log.folds[p])} entries" in dag_run.output, f"p{p}"
    amounts = {key: MONEY.deserialize(states[1][key]) for key in AMOUNTS}
    assert {key: str(amount) for key, amount in amounts.items()} == {k: str(a) for k, a in AMOUNTS.items()}


def test_the_dag_file_imports_without_deprecation_warnings(dag_run: DagRun) -> None:
    """Airflow re-emits every warning raised while it imports a DAG file (deprecated import paths among them) with the
    file's name: none may name ours."""
    assert dag_run.states, dag_run.explain()  # the DAG was parsed and run at all
    warned = [line for line in dag_run.output.splitlines() if "Warning" in line and str(DAG_FILE) in line]
    assert warned == []
