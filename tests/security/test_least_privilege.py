"""Least privilege, proven on the SASL_SSL broker: the Kafka-mode pipeline runs exactly-once as User:pipeline with
exactly the ACLs of pipeline/kafka/acls.py (SIGKILLs and a zombie included), and without any one of them it stops at
start-up, naming the missing operation and the resource, having committed nothing; granted again, the same run
finishes with a clean verdict (nothing lost, nothing twice)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from pipeline.kafka.acls import Acl, Names, pipeline_acls
from pipeline.testing import faults, inputs
from pipeline.testing.drain import drain_topic
from pipeline.testing.faults import FaultRun
from pipeline.testing.harness import committed_offsets
from tests.faults.conftest import assert_exactly_once
from tests.security.conftest import PARTITIONS, PIPELINE, names_of, refused_start, totals_records

pytestmark = pytest.mark.secure

# Every ACL of the definition, by its key for a template app: one test each.
TEMPLATE = pipeline_acls(Names("APP", "IN", "OUT"))
FAIL_FAST_S = 30  # a start without one ACL must end within this (before the check: up to for ever)
RECORDS, POISON_EVERY = 300, 100


def test_pipeline_is_exactly_once_with_exactly_its_acls(secure_run, grants) -> None:
    run = secure_run()
    grants.grant(PIPELINE, pipeline_acls(names_of(run)))
    run.feed(totals_records(5_000, seed=21), seconds=10)
    fleet = run.start(2)
    rng = random.Random(12)
    for pause_s, fault in ((1.5, "sigkill"), (2.0, "sigkill"), (1.0, "zombie")):  # zombie: SIGSTOP 8 s (> session)
        time.sleep(pause_s)
        faults.FAULTS[fault].inject(fleet, rng)

    outcome = run.finish()

    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 5_000


@pytest.mark.parametrize("index", range(len(TEMPLATE)), ids=[acl.key for acl in TEMPLATE])
def test_without_one_acl_the_start_fails_naming_it_and_commits_nothing(index: int, secure_run, grants) -> None:
    run = secure_run(processing_backoff_ms=5)  # poison records: the dead-letter topic is written too
    needed = pipeline_acls(names_of(run))
    missing = needed[index]
    inputs.produce(
        run.bootstrap,
        run.input_topic,
        totals_records(RECORDS, seed=index, poison_every=POISON_EVERY),
        partitions=PARTITIONS,
        extra_config=run.client_config,
    )
    grants.grant(PIPELINE, [acl for acl in needed if acl is not missing])

    assert_start_refused(run, missing)
    assert_nothing_committed(run)

    grants.grant(PIPELINE, [missing])
    run.start(1)
    outcome = run.finish(timeout_s=60)

    assert_exactly_once(outcome)
    poison = RECORDS // POISON_EVERY
    assert (outcome.verdict.outputs, outcome.verdict.dead_letters) == (RECORDS - poison, poison)


def named(acl: Acl) -> str:
    """How the error names it: `READ and WRITE on topic 'x-changelog'`; a prefixed ACL by a name it covers."""
    return f"{' and '.join(acl.operations)} on {acl.resource} '{acl.name}" + ("" if acl.prefixed else "'")


def assert_start_refused(run: Any, missing: Acl) -> None:
    """One instance started without `missing` exits 2 within FAIL_FAST_S, its error naming the ACL."""
    log = refused_start(run, FAIL_FAST_S, f"without {missing.key}")
    assert "configuration error: missing Kafka permission" in log, log
    assert named(missing) in log, log


def assert_nothing_committed(run: FaultRun) -> None:
    admin = AdminClient(run.client_config)
    for topic in (run.output_topic, f"{run.app_id}-dlq", f"{run.app_id}-changelog"):
        dump = drain_topic(admin, {"bootstrap.servers": run.bootstrap, **run.client_config}, topic, 20)
        assert dump.records == [], f"{topic}: {len(dump.records)} records committed by a start that failed"
    offsets = committed_offsets(
        run.bootstrap, run.app_id, run.input_topic, list(range(PARTITIONS)), 20, run.client_config
    )
    assert all(offset < 0 for offset in offsets.values()), f"group offsets committed: {offsets}"
