"""The state store the unit tests run on (issue 32): `state_store` runs a test on both, memory and disk. It sets
PIPELINE_STATE_STORE, which every AppDriver of the test follows (pipeline/testing/stores.py), and `make_state` /
`make_timed` build the store's PartitionState / TimedState."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.serde import JSON, Serde
from pipeline.state import PartitionState
from pipeline.state.disk_store import DiskPartitionState, DiskStore, DiskTimedState, StoreMemory
from pipeline.state.timed import TimedState

STORES = ("memory", "disk")
_open: list[DiskStore] = []
_memory: list[StoreMemory] = []


@pytest.fixture(params=STORES)
def state_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PIPELINE_STATE_STORE", request.param)
    yield request.param
    while _open:
        _open.pop().close()


def _store() -> DiskStore:
    if not _memory:
        _memory.append(StoreMemory(8, 8))
    store = DiskStore(Path(tempfile.mkdtemp(prefix="state-test-")) / "p0", _memory[0])
    _open.append(store)
    return store


def on_disk() -> bool:
    return os.environ.get("PIPELINE_STATE_STORE") == "disk"


def make_state(serde: Serde = JSON) -> PartitionState:
    """A fresh state on the store PIPELINE_STATE_STORE names."""
    return DiskPartitionState(_store(), serde) if on_disk() else PartitionState(serde)


def make_timed(serde: Serde = JSON, **options: Any) -> TimedState:
    if not on_disk():
        return TimedState(serde, **options)
    state = DiskTimedState(serde, **options)
    state.attach(_store())
    state._reindex()
    return state
