"""The look for input partitions nobody owns (pipeline/kafka/coverage.py), judged from the group's answers without a
broker; tests/integration/test_group_coverage_real.py makes the case on one."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Gauge

from pipeline.kafka.coverage import GroupCoverage, Member
from tests.support import eventually

BOUND_S = 10.0


def coverage(removed: list[tuple[str, str]] | None) -> tuple[GroupCoverage, Gauge]:
    gauge = Gauge("unowned", "", registry=CollectorRegistry())

    def remove(member_id: str, instance_id: str) -> str:
        assert removed is not None
        removed.append((member_id, instance_id))
        return "NoError"

    return GroupCoverage("g", "in", BOUND_S, gauge, remove if removed is not None else None, 5.0), gauge


def member(member_id: str, *partitions: int, instance_id: str = "") -> Member:
    return Member(member_id, instance_id, frozenset(partitions))


# p0 nobody's: "a" owns 1 and 2, "b" owns nothing
ORPHANED = [member("m-a", 1, 2, instance_id="a"), member("m-b", instance_id="b")]


def test_a_partition_unowned_for_less_than_the_bound_is_left_to_the_rebalance_under_way() -> None:
    removed: list[tuple[str, str]] = []
    look, gauge = coverage(removed)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S - 0.1)
    assert look.unowned_since == {0: 100.0} and gauge._value.get() == 0 and removed == []


def test_past_the_bound_it_is_said_counted_and_the_member_owning_fewest_removes_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "pipeline")
    removed: list[tuple[str, str]] = []
    look, gauge = coverage(removed)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S)
    assert gauge._value.get() == 1 and look.removals == ["b"]
    eventually(lambda: removed == [("m-b", "b")], 5)
    assert "in[0]: no member of group g owns them, for over 10 s" in caplog.text
    assert "Member b (owning 0) leaves the group to start a rebalance" in caplog.text
    eventually(lambda: "member b removed itself from group g to start a rebalance: NoError" in caplog.text, 5)
    # Not again before another bound: the rebalance it started needs its time.
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S + 2)
    assert look.removals == ["b"]
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + 2 * BOUND_S)
    assert look.removals == ["b", "b"]


def test_only_the_elected_member_acts_and_ties_go_to_the_smallest_name() -> None:
    removed: list[tuple[str, str]] = []
    look, _ = coverage(removed)
    tied = [member("m-2", 1), member("m-1", 2), member("m-3", 3, 4)]  # p0 nobody's; m-1 and m-2 own one each
    for now in (0.0, BOUND_S):
        look.judge(True, tied, 5, "m-2", now=now)
    assert look.removals == []
    look.judge(True, tied, 5, "m-1", now=2 * BOUND_S)
    assert look.removals == ["m-1"]


def test_a_group_rebalancing_or_owning_everything_resets_the_watch() -> None:
    look, gauge = coverage([])
    look.judge(True, ORPHANED, 3, "m-a", now=0.0)
    look.judge(False, ORPHANED, 3, "m-a", now=BOUND_S)  # a rebalance under way assigns it
    assert look.unowned_since == {} and gauge._value.get() == 0
    look.judge(True, ORPHANED, 3, "m-a", now=BOUND_S + 1)
    assert look.unowned_since == {0: BOUND_S + 1}
    look.judge(True, [member("m-a", 0, 1, 2)], 3, "m-a", now=3 * BOUND_S)
    assert look.unowned_since == {} and gauge._value.get() == 0


def test_without_a_removal_it_is_said_and_counted_only(caplog: pytest.LogCaptureFixture) -> None:
    """GROUP_PROTOCOL=consumer: the broker assigns."""
    caplog.set_level(logging.WARNING, "pipeline")
    look, gauge = coverage(None)
    for now in (0.0, BOUND_S):
        look.judge(True, ORPHANED, 3, "m-b", now=now)
    assert gauge._value.get() == 1 and look.removals == []
    assert "The broker assigns them (GROUP_PROTOCOL=consumer); if this lasts, restart one member" in caplog.text
