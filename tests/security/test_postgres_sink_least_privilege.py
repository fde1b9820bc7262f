"""The PostgreSQL sink on the secured broker needs only READ on its input topic and on its group (postgres_acls):
results, state, dead letters and the offsets that count live in the database. With exactly those it runs
exactly-once through a SIGKILL; without either one it stops at start-up naming it, and granted again it finishes
cleanly."""

from __future__ import annotations

import time

import pytest

from pipeline.kafka.acls import Names, postgres_acls
from tests.security.conftest import PIPELINE, totals_records
from tests.security.test_least_privilege import assert_start_refused

pytestmark = [pytest.mark.secure, pytest.mark.postgres]
TEMPLATE = postgres_acls(Names("APP", "IN", ""))


def test_postgres_sink_is_exactly_once_with_exactly_its_acls(secure_pg_run, grants) -> None:
    run = secure_pg_run(processing_backoff_ms=5)
    grants.grant(PIPELINE, postgres_acls(run.names))
    run.feed(totals_records(4_000, seed=31, poison_every=500), seconds=6)
    fleet = run.start(2)
    time.sleep(3)
    fleet.alive[0].kill()  # mid-stream
    fleet.start(1)

    verdict = run.finish()

    assert verdict.ok, verdict.summary() + "\n" + fleet.logs()
    assert (verdict.outputs, verdict.dead_letters) == (4_000 - 8, 8)


@pytest.mark.parametrize("index", range(len(TEMPLATE)), ids=[acl.key for acl in TEMPLATE])
def test_without_one_acl_the_postgres_sink_stops_at_start_naming_it(index: int, secure_pg_run, grants) -> None:
    run = secure_pg_run()
    needed = postgres_acls(run.names)
    missing = needed[index]
    run.produce(totals_records(300, seed=index))
    grants.grant(PIPELINE, [acl for acl in needed if acl is not missing])

    assert_start_refused(run, missing)

    grants.grant(PIPELINE, [missing])
    run.start(1)
    verdict = run.finish()
    assert verdict.ok, verdict.summary() + "\n" + run.fleet.logs()
    assert verdict.outputs == 300
