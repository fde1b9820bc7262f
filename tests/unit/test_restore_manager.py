"""RestoreManager's bookkeeping (no broker: ChangelogRestore replaced by a scripted fake): finished restores come back
once with their state, broker trouble starts a restore again a second later until RESTORE_TIMEOUT_MS, and a
forgotten partition's restore is closed."""

from __future__ import annotations

from typing import ClassVar

import pytest

import pipeline.state.restore_manager as restore_module
from pipeline.kafka.offsets import EndOffsetsTimeout
from pipeline.serde import JSON
from pipeline.settings import Settings
from pipeline.state.restore import RestoreError
from pipeline.state.restore_manager import RestoreManager
from tests.fakes import FakeClock


class FakeRestore:
    """Finishes at its second step(); `failures` holds what its construction raises instead, per partition."""

    made: ClassVar[list[FakeRestore]] = []
    failures: ClassVar[dict[int, list[BaseException]]] = {}

    def __init__(self, make_consumer, admin, topic, partition, state, committed_offset, *args, **kwargs) -> None:
        if FakeRestore.failures.get(partition):
            raise FakeRestore.failures[partition].pop(0)
        self.partition, self.state, self.committed_offset, self.admin = partition, state, committed_offset, admin
        self.steps, self.closed = 0, False
        FakeRestore.made.append(self)

    def step(self, budget_s: float) -> bool:
        self.steps += 1
        return self.steps >= 2

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    FakeRestore.made, FakeRestore.failures = [], {}
    monkeypatch.setattr(restore_module, "ChangelogRestore", FakeRestore)
    monkeypatch.setattr(restore_module, "time", clock)
    return clock


def manager() -> tuple[RestoreManager, list[str]]:
    admins = ["first admin"]

    def make_admin() -> str:
        admins.append(f"admin {len(admins) + 1}")
        return admins[-1]

    restores = RestoreManager(
        Settings(restore_timeout_ms=10_000),
        "cl",
        "snap",
        JSON,
        lambda: None,  # type: ignore[arg-type]
        make_admin,
        admins[0],
    )  # type: ignore[arg-type]
    return restores, admins


def test_finished_restores_come_back_once_with_a_state_of_their_own_and_are_forgotten(clock: FakeClock) -> None:
    restores, _ = manager()
    restores.start(0, 5)
    restores.start(1, None)
    assert restores.busy and set(restores.running()) == {0, 1}
    assert restores.step() == []
    finished = restores.step()
    assert [(r.partition, r.committed_offset) for r in finished] == [(0, 5), (1, None)]
    assert finished[0].state is not finished[1].state and all(r.closed for r in finished)
    assert not restores.busy and restores.step() == []


def test_broker_trouble_starts_the_restore_again_a_second_later_with_a_new_admin_client(clock: FakeClock) -> None:
    restores, admins = manager()
    FakeRestore.failures[0] = [EndOffsetsTimeout("cl: end offsets not known within 5s")]
    restores.start(0, 7)
    assert restores.busy and restores.running() == {}  # waiting to start again
    assert restores.step() == []
    clock.now += 1.0
    restores.step()
    [restore] = FakeRestore.made
    assert restore.admin == admins[-1] == "admin 2" and restore.committed_offset == 7


def test_broker_trouble_for_longer_than_the_restore_timeout_is_a_restore_error(clock: FakeClock) -> None:
    restores, _ = manager()
    FakeRestore.failures[0] = [EndOffsetsTimeout(f"try {i}") for i in range(20)]
    restores.start(0, 7)
    with pytest.raises(RestoreError, match=r"p0: restore kept failing for 1\ds: try 1\d"):
        for _ in range(20):
            clock.now += 1.0
            restores.step()


def test_a_forgotten_partition_is_closed_and_never_comes_back(clock: FakeClock) -> None:
    restores, _ = manager()
    restores.start(3, 0)
    restores.forget(3)
    assert FakeRestore.made[0].closed and not restores.busy
    assert restores.step() == [] and restores.step() == []
