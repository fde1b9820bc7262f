"""Faults against real `pipeline run` processes writing to a real PostgreSQL: SIGKILL, a zombie, the server
killed and restarted. Every test asserts the table checker's verdict (each input coordinate exactly once in
`outputs` or the dead letters, `totals` and the state table equal to the offline fold, offsets at the input's end)."""

from __future__ import annotations

import random
import time

import pytest

from pipeline.testing.harness import group_owners
from tests.plugins.postgres import _postgres_sh, connect
from tests.postgres.conftest import TOTALS_PG, assert_exactly_once, totals_input
from tests.support import eventually

pytestmark = pytest.mark.postgres
UNFENCED = "tests.postgres.unfenced:app"  # runs in the pipeline processes only: importing it patches PostgresTask


def test_happy_path_two_instances_with_poison_records(pg_run):
    run = pg_run(processing_backoff_ms=5)
    run.feed(totals_input(12_000, seed=1, poison_every=400), seconds=2)
    run.start(2)
    verdict = run.finish()
    assert_exactly_once(verdict, run)
    assert verdict.dead_letters == 12_000 // 400
    assert verdict.outputs == 12_000 - 12_000 // 400


def test_sigkill_at_random_moments(pg_run):
    run = pg_run()
    run.feed(totals_input(15_000, seed=2), seconds=9)
    fleet = run.start(2)
    rng = random.Random(11)
    for _ in range(3):
        time.sleep(rng.uniform(1.0, 2.5))
        rng.choice(fleet.alive).kill()
        fleet.start(1)
    verdict = run.finish()
    assert_exactly_once(verdict, run)
    assert verdict.outputs == 15_000


def _zombie_run(pg_run, app_spec: str):
    """Two instances; the busier one is paused past the session time-out while holding an uncommitted batch (a long
    commit interval makes that near certain), the other takes its partitions over and fences them, then the zombie
    wakes up and tries to commit its batch."""
    run = pg_run(app_spec, check_with=TOTALS_PG, commit_interval_ms=1500)
    run.feed(totals_input(12_000, seed=3), seconds=14)
    fleet = run.start(2)
    owners = eventually(lambda: _both_own_partitions(run))
    zombie = next(i for i in fleet.instances if i.name == max(owners, key=lambda name: len(owners[name])))
    time.sleep(1)
    zombie.pause()
    time.sleep(9)  # past session.timeout.ms (6 s): the other instance is assigned everything and fences
    taken_over = group_owners(run.bootstrap, run.app_id)
    zombie.resume()
    time.sleep(3)
    assert zombie.alive, "the zombie should rejoin, not crash:\n" + zombie.log_tail()
    assert sorted(p for parts in taken_over.values() for p in parts) == [0, 1, 2]
    assert zombie.name not in taken_over
    return run, zombie, run.finish()


def _both_own_partitions(run) -> dict[str, list[int]] | None:
    owners = group_owners(run.bootstrap, run.app_id)
    return owners if len(owners) == 2 and all(owners.values()) else None


def test_zombie_transactions_fail_on_the_epoch_check(pg_run):
    run, zombie, verdict = _zombie_run(pg_run, TOTALS_PG)
    log = zombie.log_path.read_text()
    assert "epoch check failed" in log, "the zombie never tried to commit its batch:\n" + zombie.log_tail()
    assert_exactly_once(verdict, run)


def test_without_the_epoch_check_the_zombie_writes_duplicates(pg_run):
    """The test double (tests/postgres/unfenced.py) proves the zombie test can fail: same run, no epoch check."""
    _, zombie, verdict = _zombie_run(pg_run, UNFENCED)
    assert "epoch check failed" not in zombie.log_path.read_text()
    assert not verdict.ok
    assert verdict.duplicates.count > 0, verdict.summary()


def test_postgres_killed_and_restarted_mid_run(pg_run, postgres_dsn):
    if postgres_dsn != _postgres_sh("dsn") or "running" not in _postgres_sh("status"):
        pytest.skip("needs the local server of deploy/local/postgres.sh to kill and restart")
    run = pg_run(postgres_retry_backoff_max_ms=1000)
    run.feed(totals_input(12_000, seed=4), seconds=9)
    fleet = run.start(2)
    eventually(lambda: _rows(postgres_dsn, run.schema) > 500)
    try:
        _postgres_sh("kill")
        time.sleep(2)
    finally:
        _postgres_sh("start")
    verdict = run.finish()
    logs = run.logs()
    assert "PostgreSQL write failed" in logs or "take-over (fence + restore) failed" in logs, fleet.logs()
    assert "taken over again" in logs, fleet.logs()
    assert [i.process.returncode for i in fleet.instances] == [0, 0], "an instance died:\n" + fleet.logs()
    assert_exactly_once(verdict, run)
    assert verdict.outputs == 12_000


def _rows(dsn: str, schema: str) -> int:
    with connect(dsn) as conn:
        try:
            return conn.execute(f'SELECT count(*) FROM "{schema}".outputs').fetchone()[0]
        except Exception:
            return 0
