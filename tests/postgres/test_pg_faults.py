"""Faults against real `pipeline run` processes writing to a real PostgreSQL: SIGKILL, a zombie, the server
killed and restarted. Every test asserts the table checker's verdict (each input coordinate exactly once in
`outputs` or the dead letters, `totals` and the state table equal to the offline fold, offsets at the input's end)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from psycopg import sql

from pipeline.testing.harness import Instance, group_owners
from pipeline.testing.oracle.verdict import Verdict
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
    wakes up and tries to commit its batch; then more records."""
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
    # Records after the zombie woke: without the epoch check (the test double) its late commit moves p's offsets row
    # back, and only a later commit of the owner moves it forward again. In CI the first feed had ended before the
    # zombie woke: the owner, caught up, never committed again and the row stayed behind for good.
    run.feed(totals_input(1_500, seed=5), seconds=2)
    assert sorted(p for parts in taken_over.values() for p in parts) == [0, 1, 2]
    assert zombie.name not in taken_over
    return run, zombie, run.finish()


def _both_own_partitions(run) -> dict[str, list[int]] | None:
    owners = group_owners(run.bootstrap, run.app_id)
    return owners if len(owners) == 2 and all(owners.values()) else None


def _zombie_runs(pg_run, dsn: str, schema: str, app_spec: str, shows: Callable[[Instance, Verdict], bool]) -> list:
    """Up to three zombie runs, until one `shows` what the test is about. The zombie must be paused holding a batch it
    has not committed; the long commit interval makes that likely, not certain: on a loaded machine, full-suite runs
    paused it mid-commit (it finished the commit on waking, before its membership was found lost, and had nothing
    open any more), and such a run proves nothing about the fence either way."""
    attempts = []
    for attempt in range(3):
        if attempt:  # the outputs table has no app id: a run after another must start from empty tables
            with connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {0} CASCADE; CREATE SCHEMA {0}").format(sql.Identifier(schema)))
        attempts.append(_zombie_run(pg_run, app_spec))
        if shows(*attempts[-1][1:]):
            break
    return attempts


def _fenced(zombie: Instance, verdict: Verdict) -> bool:
    return "epoch check failed" in zombie.log_path.read_text()


def test_zombie_transactions_fail_on_the_epoch_check(pg_run, postgres_dsn, pg_schema):
    attempts = _zombie_runs(pg_run, postgres_dsn, pg_schema, TOTALS_PG, _fenced)
    for run, _, verdict in attempts:
        assert_exactly_once(verdict, run)  # every run, whether or not its zombie had a batch open
    zombie = attempts[-1][1]
    assert _fenced(*attempts[-1][1:]), "the zombie never tried to commit its batch:\n" + zombie.log_tail()


def test_without_the_epoch_check_the_zombie_writes_duplicates(pg_run, postgres_dsn, pg_schema):
    """The test double (tests/postgres/unfenced.py) proves the zombie test can fail: same runs, no epoch check."""

    def duplicated(zombie: Instance, verdict: Verdict) -> bool:
        return not verdict.ok and verdict.duplicates.count > 0

    attempts = _zombie_runs(pg_run, postgres_dsn, pg_schema, UNFENCED, duplicated)
    assert not any(_fenced(*attempt[1:]) for attempt in attempts)
    assert duplicated(*attempts[-1][1:]), "\n".join(verdict.summary() for _, _, verdict in attempts)


def test_postgres_killed_and_restarted_mid_run(pg_run, postgres_dsn, postgres_alone):
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
