"""The look for input partitions nobody owns (pipeline/kafka/coverage.py), judged from the group's answers without a
broker; tests/integration/test_group_coverage_real.py makes the case on one."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Gauge

from pipeline.kafka.coverage import GroupCoverage
from pipeline.kafka.kafka_python import GroupAnswer, GroupMember

BOUND_S = 10.0


class FakeAdmin:
    """Answers as told; records the removals."""

    def __init__(self, answer: GroupAnswer | Exception) -> None:
        self.answer = answer
        self.removed: list[tuple[str, str]] = []

    def describe(self, topic: str) -> GroupAnswer:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def remove(self, member_id: str, instance_id: str) -> str:
        self.removed.append((member_id, instance_id))
        return "NoError"

    def close(self) -> None:
        pass


def coverage(admin: FakeAdmin | None = None) -> tuple[GroupCoverage, Gauge, FakeAdmin]:
    gauge = Gauge("unowned", "", registry=CollectorRegistry())
    admin = admin or FakeAdmin(("Stable", [], 0))
    return GroupCoverage("g", "in", BOUND_S, gauge, admin), gauge, admin


def member(member_id: str, *partitions: int, instance_id: str = "") -> GroupMember:
    return GroupMember(member_id, instance_id, frozenset(partitions))


# p0 nobody's: "a" owns 1 and 2, "b" owns nothing
ORPHANED = [member("m-a", 1, 2, instance_id="a"), member("m-b", instance_id="b")]


def test_a_partition_unowned_for_less_than_the_bound_is_left_to_the_rebalance_under_way() -> None:
    look, gauge, admin = coverage()
    look.judge(True, ORPHANED, 3, "m-b", now=100.0)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S - 0.1)
    assert look.unowned_since == {0: 100.0} and gauge._value.get() == 0 and admin.removed == []


def test_past_the_bound_it_is_said_counted_and_the_member_owning_fewest_removes_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "pipeline")
    look, gauge, admin = coverage()
    look.judge(True, ORPHANED, 3, "m-b", now=100.0)
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S)
    assert gauge._value.get() == 1 and look.removals == ["b"] and admin.removed == [("m-b", "b")]
    assert "in[0]: no member of group g owns them, for over 10 s" in caplog.text
    assert "Member b (owning 0) leaves the group to start a rebalance" in caplog.text
    assert "member b removed itself from group g to start a rebalance: NoError" in caplog.text
    # Not again before another bound: the rebalance it started needs its time.
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + BOUND_S + 2)
    assert look.removals == ["b"]
    look.judge(True, ORPHANED, 3, "m-b", now=100.0 + 2 * BOUND_S)
    assert look.removals == ["b", "b"]


def test_only_the_elected_member_acts_and_ties_go_to_the_smallest_name() -> None:
    look, _, _ = coverage()
    tied = [member("m-2", 1), member("m-1", 2), member("m-3", 3, 4)]  # p0 nobody's; m-1 and m-2 own one each
    for now in (0.0, BOUND_S):
        look.judge(True, tied, 5, "m-2", now=now)
    assert look.removals == []
    look.judge(True, tied, 5, "m-1", now=2 * BOUND_S)
    assert look.removals == ["m-1"]


def test_a_group_rebalancing_or_owning_everything_resets_the_watch() -> None:
    look, gauge, _ = coverage()
    look.judge(True, ORPHANED, 3, "m-a", now=0.0)
    look.judge(False, ORPHANED, 3, "m-a", now=BOUND_S)  # a rebalance under way assigns it
    assert look.unowned_since == {} and gauge._value.get() == 0
    look.judge(True, ORPHANED, 3, "m-a", now=BOUND_S + 1)
    assert look.unowned_since == {0: BOUND_S + 1}
    look.judge(True, [member("m-a", 0, 1, 2)], 3, "m-a", now=3 * BOUND_S)
    assert look.unowned_since == {} and gauge._value.get() == 0


def test_a_look_reads_the_admin_answer_and_an_unreadable_group_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pipeline")
    answer = ("Stable", [member("m-a", 1, 2, instance_id="a"), member("m-b", instance_id="b")], 3)
    clock = iter([0.0, BOUND_S])
    admin = FakeAdmin(answer)
    look = GroupCoverage("g", "in", BOUND_S, Gauge("u", "", registry=CollectorRegistry()), admin, lambda: next(clock))
    look.member_id = "m-b"
    look.look()
    look.look()
    assert admin.removed == [("m-b", "b")]
    admin.answer = RuntimeError("coordinator moved")
    look.look()
    look.look()
    assert caplog.text.count("group coverage: the group's assignment not readable (coordinator moved)") == 1
