"""Warm standbys (STANDBY_REPLICAS, pipeline/state/standby.py) against real processes on a real broker: a member's
partitions are copied by its peer; when the member is SIGKILLed the peer promotes its copies and reads only the
changelog they are behind. The checker's verdict is the judge: a copy that missed a change, applied one twice or
stood at a wrong offset gives wrong totals; a copy whose checkpoint disagrees with the group's offset is discarded for
a full restore (an ERROR), which the tests also refuse.

Both tests run on both state stores: with STATE_STORE=disk the copies live in the peer's RocksDB (each followed
batch written with the changelog offset it reaches), a promotion hands that store to the new owner's restore, and the
victim's replacement, on the victim's state directory, restarts from its local stores.

Red on purpose: a follower that stops applying changes after its first batches (positions still moving) fails both
tests (the copies are discarded at promotion). On disk, a follower that records the offset a batch reaches but drops
its changes gave a wrong-content verdict in one or the other disk case per run (which one depends on whether the
copy had followed anything before the kill). A promotion that skips the tail is not caught here (the copies are
current when promoted, the victim's last transaction aborted): tests/integration/test_standby_real.py catches it."""

from __future__ import annotations

import time

import pytest

from pipeline.testing.faults import FaultRun
from pipeline.testing.harness import Fleet, Instance
from tests.faults.conftest import assert_exactly_once, busiest_owner
from tests.faults.test_process_faults import totals_input
from tests.support import eventually

WARM = "standby copy warm"
PROMOTING = "promoting the standby copy"
STORES = pytest.mark.parametrize("store", ["memory", "disk"])
RESTORED_FROM_COPY = "(a standby copy of"
DISCARDED = "the standby copy does not match"


def _warm_pair(run: FaultRun, fleet: Fleet) -> tuple[Instance, Instance]:
    """(the busiest owner, its peer) once the peer holds warm copies of the owner's partitions."""
    victim = busiest_owner(run, fleet)
    (peer,) = [i for i in fleet.alive if i is not victim]
    eventually(lambda: WARM in peer.log_path.read_text(), 60, 0.2)
    return victim, peer


def _promoted(peer: Instance) -> None:
    """The peer restored the victim's partitions from its copies, and kept every copy it promoted."""
    eventually(lambda: RESTORED_FROM_COPY in peer.log_path.read_text(), 60, 0.2)
    assert PROMOTING in peer.log_path.read_text(), peer.log_tail()  # handed over warm, not found on disk after a drop
    assert DISCARDED not in peer.log_path.read_text(), peer.log_tail()


@STORES
def test_a_killed_members_partitions_are_taken_over_from_warm_copies(fault_run, store):
    run = fault_run(standby_replicas="1", state_store=store)
    run.feed(totals_input(24_000, seed=41), seconds=16)
    fleet = run.start(2)
    victim, peer = _warm_pair(run, fleet)
    time.sleep(2)  # the copies follow the owner's commits for a while
    victim.kill()
    _promoted(peer)
    fleet.start(1)  # the victim's replacement: partitions move back, the peer's promoted ones become copies again
    outcome = run.finish(timeout_s=180)
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 24_000
    assert DISCARDED not in peer.log_path.read_text(), peer.log_tail()


@STORES
def test_a_copy_left_behind_is_promoted_and_reads_what_it_missed(fault_run, store):
    """The peer is paused while the owner commits (its copies fall seconds behind), woken, and the owner is killed at
    once: the promotion starts from a copy far behind the changelog's end. FAILURE_DETECTION_MS off: with the default
    bound (1 s) the 2.5 s pause would get the peer removed and fenced, which is not what this test is about."""
    run = fault_run(standby_replicas="1", failure_detection_ms="0", state_store=store)
    run.feed(totals_input(24_000, seed=42), seconds=16)
    fleet = run.start(2)
    victim, peer = _warm_pair(run, fleet)
    peer.pause()
    time.sleep(2.5)  # below the session time-out: the peer stays a member, its copies fall behind
    peer.resume()
    victim.kill()
    _promoted(peer)
    outcome = run.finish(timeout_s=180)
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 24_000
    assert DISCARDED not in peer.log_path.read_text(), peer.log_tail()
