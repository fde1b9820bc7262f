"""FAILURE_DETECTION_MS on the SASL_SSL broker, as User:pipeline with exactly the ACLs `pipeline acls` lists for it
(pipeline/kafka/acls.py, `failure_detection=True`): a SIGKILLed member's peer fences its per-process producer and
removes it from the group (LeaveGroup) long before its 30 s session time-out, and the run stays exactly once; without
any one of the ACLs the detector needs, the start stops naming the operation and the resource."""

from __future__ import annotations

import time

import pytest

from pipeline.kafka.acls import Names, pipeline_acls
from pipeline.testing.harness import group_owners
from tests.faults.conftest import assert_exactly_once
from tests.security.conftest import PARTITIONS, PIPELINE, names_of, totals_records
from tests.security.test_least_privilege import assert_nothing_committed, assert_start_refused
from tests.support import eventually

pytestmark = pytest.mark.secure

DETECTION = {
    "failure_detection_ms": "1000",
    "session_timeout_ms": "30000",
    "transaction_timeout_ms": "30000",
    "producers": "per_process",  # the peer's producer is fenced too: its transactional id must be allowed
    "group_instance_id": "",
}
REMOVED = "removed from group"
# What detection adds to the definition, or gives a new reason (the group: LeaveGroup), by key for a template app.
PLAIN = {acl.key: acl.why for acl in pipeline_acls(Names("APP", "IN", "OUT"), failure_detection=False)}
ADDED = [
    acl.key
    for acl in pipeline_acls(Names("APP", "IN", "OUT"), failure_detection=True)
    if acl.key not in PLAIN or (acl.resource == "group" and PLAIN[acl.key] != acl.why)
]


def test_the_detection_acls_are_the_heartbeat_topic_and_the_group() -> None:
    assert ADDED == ["topic:APP-liveness:READ+WRITE", "group:APP:READ", "topic:APP-liveness:CREATE"]


def test_with_exactly_its_acls_a_killed_peer_is_removed_and_the_run_is_exactly_once(secure_run, grants) -> None:
    run = secure_run(**DETECTION)
    grants.grant(PIPELINE, pipeline_acls(names_of(run), failure_detection=True))
    run.feed(totals_records(10_000, seed=31), seconds=12)
    fleet = run.start(2)
    config = run.client_config

    def both_own() -> bool:
        owners = group_owners(run.bootstrap, run.app_id, config=config)
        return len(owners) == 2 and all(owners.values())

    eventually(both_own, 60, 0.2)
    time.sleep(2)  # mid-stream: the victim has a transaction open
    victim, survivor = fleet.instances
    victim.kill()
    # Everything is the survivor's while the victim's session (30 s) and transaction (30 s) would still hold it.
    everything = list(range(PARTITIONS))
    eventually(lambda: group_owners(run.bootstrap, run.app_id, config=config).get(survivor.name) == everything, 25)
    log = survivor.log_path.read_text(errors="replace")
    assert REMOVED in log and "could not remove" not in log, survivor.log_tail()
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 10_000


@pytest.mark.parametrize("key", ADDED)
def test_without_a_detection_acl_the_start_fails_naming_it(key: str, secure_run, grants) -> None:
    run = secure_run(**DETECTION)
    needed = pipeline_acls(names_of(run), failure_detection=True)
    (missing,) = [acl for acl in needed if acl.key.replace(run.app_id, "APP") == key]
    grants.grant(PIPELINE, [acl for acl in needed if acl is not missing])

    assert_start_refused(run, missing)
    assert_nothing_committed(run)
