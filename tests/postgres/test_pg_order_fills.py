"""order_fills on the PostgreSQL sink (pipeline/examples/order_fills_pg.py): two co-partitioned inputs merged in
timestamp order and a global table, written by real `pipeline run` processes to a real PostgreSQL under SIGKILLs, a
SIGSTOP zombie and (on the 3-node cluster) an input's leader killed and restarted; and a co-partitioned table
(tests/postgres/limits_app.py) under SIGKILLs. Every test asserts the table checker's verdict, which replays the order
pipeline_merge_order recorded, and for order_fills its own check (no fill counted twice, filled/remaining as folded,
desk versions never going back)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pipeline.examples import order_fills
from pipeline.loading import load_app
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import checker, postgres_checker
from pipeline.testing.faults import FAULTS, FaultRun, Outcome
from pipeline.testing.harness import Instance
from tests.faults.conftest import busiest_owner
from tests.faults.test_broker_faults import leader_of
from tests.postgres import limits_app

pytestmark = pytest.mark.postgres
SPEC = "pipeline.examples.order_fills_pg:app"
LIMITS_APP = "tests.postgres.limits_app:app"
UNFENCED = "tests.postgres.unfenced_fills:app"  # runs in the pipeline processes only: importing it patches the task
PARTITIONS = 3


@pytest.fixture
def pg_fault_run(kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path) -> Iterator:
    runs: list[FaultRun] = []

    def make(spec: str = SPEC, bootstrap: str | None = None, replication: int = 1, **env: str) -> FaultRun:
        """`bootstrap`: another Kafka than the shared broker (the 3-node cluster, replication 3)."""
        settings = {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()}
        run = FaultRun(
            # The same App; importing the unfenced double here would patch PostgresTask for every later test of
            # this process (a full run's test_pg_protocol then saw no fence).
            load_app(SPEC if spec == UNFENCED else spec),
            spec,
            bootstrap or kafka_bootstrap,
            PARTITIONS,
            tmp_path / "logs",
            settings,
            replication,
            postgres_dsn=postgres_dsn,
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.abandon()


def assert_exactly_once_with_fills(outcome: Outcome) -> None:
    assert outcome.verdict is not None, f"did not catch up, lag per partition {outcome.stuck}\n{outcome.logs}"
    assert outcome.verdict.ok, outcome.verdict.summary() + "\n" + outcome.logs[-20_000:]
    assert not outcome.exited, "instances exited by themselves:\n" + "\n".join(outcome.exited)
    assert outcome.verdict.app.count == 0, outcome.verdict.app.samples  # order_fills.check
    assert outcome.verdict.outputs > 300 and outcome.verdict.dead_letters > 0, outcome.verdict.summary()


def test_order_fills_on_postgres_exactly_once_under_sigkill_rounds(pg_fault_run):
    run = pg_fault_run()
    run.feed(list(order_fills.generate(6_000, PARTITIONS, 31)), seconds=12)
    fleet = run.start(2)
    busiest_owner(run, fleet)  # both joined and own partitions
    rng = random.Random(31)
    for _ in range(2):
        time.sleep(rng.uniform(1.5, 3.0))
        FAULTS["sigkill"].inject(fleet, rng)  # kills one, starts a replacement: it fences and restores p
    assert_exactly_once_with_fills(run.finish())


@pytest.mark.cluster
def test_order_fills_on_postgres_exactly_once_through_the_leader_of_an_input_killed_and_restarted(
    pg_fault_run, kafka_cluster
):
    """The PostgreSQL sink reads its inputs from Kafka: on the 3-node cluster, the leader of the fills' partition 0
    dies and comes back mid-run. Each task goes on from the offsets row of its last database transaction."""
    run = pg_fault_run(bootstrap=kafka_cluster.bootstrap, replication=3)
    run.feed(list(order_fills.generate(6_000, PARTITIONS, 38)), seconds=12)
    fleet = run.start(2)
    busiest_owner(run, fleet)  # both joined and own partitions: the fault strikes while the input flows
    time.sleep(2)
    node = leader_of(kafka_cluster.bootstrap, run.run_app.streams[1].topic, 0)
    kafka_cluster.kill(node)
    time.sleep(2)
    kafka_cluster.restart(node)
    assert_exactly_once_with_fills(run.finish(timeout_s=180))


def zombie_run(pg_fault_run, spec: str, seed: int) -> tuple[Instance, Outcome]:
    """Two instances; the busier one is paused past the session time-out holding a batch it has not committed (a
    long commit interval makes that likely), the other fences its partitions and reads every topic's offsets row,
    then the zombie wakes up and tries to commit."""
    run = pg_fault_run(spec, commit_interval_ms=1500)
    records = list(order_fills.generate(7_000, PARTITIONS, seed))
    run.feed(records[:6_000], seconds=14)
    fleet = run.start(2)
    zombie = busiest_owner(run, fleet)
    time.sleep(1)
    zombie.pause()
    time.sleep(9)  # past session.timeout.ms (6 s)
    zombie.resume()
    time.sleep(3)
    # Records after the zombie woke: without the epoch check its late commit moves the offsets rows back, and only
    # a later commit of the owner moves them forward (tests/postgres/test_pg_faults.py: _zombie_run).
    run.feed(records[6_000:], seconds=2)
    return zombie, run.finish()


def test_order_fills_on_postgres_exactly_once_with_a_zombie(pg_fault_run):
    zombie, outcome = zombie_run(pg_fault_run, SPEC, 32)
    assert_exactly_once_with_fills(outcome)
    assert "lost [" in zombie.log_path.read_text(), "the zombie never noticed it lost its partitions"


def test_without_the_epoch_check_the_order_fills_zombie_writes_duplicates(pg_fault_run):
    """The same zombie run against tests/postgres/unfenced_fills.py (no epoch check) finds duplicates: the zombie test
    above can fail. Up to three runs: a zombie paused right after a commit has nothing to write late."""
    outcomes = []
    for seed in (34, 35, 36):
        outcomes.append(zombie_run(pg_fault_run, UNFENCED, seed)[1])
        verdict = outcomes[-1].verdict
        if verdict is not None and verdict.duplicates.count > 0:
            break
    verdict = outcomes[-1].verdict
    assert verdict is not None and verdict.duplicates.count > 0, "\n".join(
        o.verdict.summary() if o.verdict else "did not catch up" for o in outcomes
    )


def test_pipeline_verify_judges_an_order_fills_run_on_postgres(pg_fault_run, kafka_bootstrap, postgres_dsn):
    run = pg_fault_run()
    run.feed(list(order_fills.generate(2_000, PARTITIONS, 37)), seconds=3)
    run.start(1)
    run._feeder.join(60)
    target = Target(run.tables.schema, run.run_app, run.app_id, run.input_topic)
    assert not postgres_checker.wait_caught_up(kafka_bootstrap, postgres_dsn, target, range(PARTITIONS), 90)
    args = ["verify", SPEC, "--sink", "postgres", "--dsn", postgres_dsn, "--schema", run.tables.schema]
    args += [f"--topic-suffix={run.suffix}", "--app-id", run.app_id, "--bootstrap-servers", kafka_bootstrap]
    assert checker.main(args) == 0
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # one fill lost: verify must say so
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE row_id = (SELECT min(row_id) FROM {})").format(
                sql.Identifier(run.tables.schema, "fills"), sql.Identifier(run.tables.schema, "fills")
            )
        )
    assert checker.main(args) == 1


def test_a_co_partitioned_table_on_postgres_exactly_once_under_sigkill_rounds(pg_fault_run):
    """Each take-over restores the table from its topic to the end, ahead of the trades processed again: the checker
    loads what the restore read where the next transaction began, and compares every output's value (the limit the
    trade saw)."""
    run = pg_fault_run(LIMITS_APP)
    run.feed(list(limits_app.generate(6_000, PARTITIONS, 33)), seconds=10)
    fleet = run.start(2)
    busiest_owner(run, fleet)
    rng = random.Random(33)
    for _ in range(3):
        time.sleep(rng.uniform(1.0, 2.5))
        FAULTS["sigkill"].inject(fleet, rng)
    outcome = run.finish()
    assert outcome.verdict is not None, f"did not catch up, lag per partition {outcome.stuck}\n{outcome.logs}"
    assert outcome.verdict.ok, outcome.verdict.summary() + "\n" + outcome.logs[-20_000:]
    assert not outcome.exited, "instances exited by themselves:\n" + "\n".join(outcome.exited)
    assert outcome.verdict.outputs > 1_000 and outcome.verdict.dead_letters > 0, outcome.verdict.summary()
