"""Restore never trusts a last stable offset pinned by a dead producer (docs/guarantees.md: complete-restore; issue 22,
as KAFKA-10167 in Kafka Streams). Under PRODUCERS=per_process a new owner cannot abort a dead owner's open
transaction: a process killed between writing p's changelog (commit step 1) and committing leaves it open, and p's
last stable offset stays below it until TRANSACTION_TIMEOUT_MS. Two take-overs of p within that time:

    the pin      an open transaction on changelog p0 (what the killed process left: a producer that never ends it)
    owner B      takes p0 over, restores, commits state above the pin
    owner C      takes p0 over from B while the pin still holds

A restore that stopped at the last stable offset would give C the state below the pin and miss B's commits (C would
then refuse p0: its checkpoint disagrees with the group's offset). The restore reads to the high watermark instead,
waiting until the pin ends, so every owner starts from all committed state; the verdict is clean. Red on purpose:
`ChangelogRestore` capturing its end with `stable_end_offsets` instead of `high_watermarks`."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from pipeline.state.changelog import changelog_topic
from tests.faults.conftest import assert_exactly_once
from tests.faults.test_process_faults import totals_input
from tests.support import eventually

PIN_TIMEOUT_MS = 20_000


def pin_changelog(bootstrap: str, app_id: str, partition: int) -> Producer:
    """An open transaction on changelog `partition` that nobody ends: the broker aborts it after PIN_TIMEOUT_MS."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{app_id}.dead-process",
            "transaction.timeout.ms": PIN_TIMEOUT_MS,
        }
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(changelog_topic(app_id), b'{"pinned": true}', key=b"account-pin", partition=partition)
    producer.flush(10)
    return producer


def test_two_take_overs_within_one_transaction_timeout_miss_no_committed_state(fault_run):
    run = fault_run(producers="per_process", group_instance_id="")
    run.feed(totals_input(24_000, seed=31), seconds=26)
    fleet = run.start(1)
    first = fleet.instances[0]
    eventually(lambda: "assigned [0, 1, 2]" in first.log_path.read_text(), 60, 0.2)
    time.sleep(2)
    pin = pin_changelog(run.bootstrap, run.app_id, 0)
    pinned_at = time.monotonic()
    first.kill()  # the first take-over: B, once the killed member's session (6 s) ends
    (second,) = fleet.start(1)
    eventually(lambda: "assigned [0, 1, 2]" in second.log_path.read_text(), 30, 0.2)
    time.sleep(3)  # B has committed work of its own (above the pin, had it not waited for it)
    second.kill()  # the second take-over: C, while the pin still holds
    fleet.start(1)
    assert time.monotonic() - pinned_at < PIN_TIMEOUT_MS / 1000, "the take-overs came after the pin had ended"
    outcome = run.finish(timeout_s=180)
    del pin
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 24_000
