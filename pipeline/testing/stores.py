"""The test driver on either state store (issue 32): `AppDriver(app, state_store="disk")`, or every driver of a test
run with PIPELINE_STATE_STORE=disk in the environment (memory by default), so that one suite of a service's tests
runs on both. A disk driver without a state_dir gets a directory of its own, removed when the driver goes."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from typing import Any

from pipeline import settings as settings_module
from pipeline.app import App
from pipeline.serde import Serde
from pipeline.settings import Settings
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint
from pipeline.state.disk_store import DiskBacked
from pipeline.state.local_stores import LocalStores, local_stores


class DriverStores:
    """Where the driver's restores fold the changelog: a fresh PartitionState, or p's disk store wiped."""

    def __init__(self, local: LocalStores | None) -> None:
        self.local = local

    def fresh(self, p: int, serde: Serde) -> PartitionState:
        if self.local is None:
            return PartitionState(serde)
        state, _ = self.local.base(p, serde)
        state.clear_all()  # the driver folds the whole committed changelog, as a restore without a local copy
        return state

    def restored(self, state: PartitionState, end: int, checkpoint: Checkpoint | None) -> None:
        if isinstance(state, DiskBacked):
            state.store.mark(end, checkpoint, None)


def driver_settings(owner: object, app: App, values: Mapping[str, Any]) -> tuple[Settings, DriverStores]:
    """The driver's settings (no environment, but PIPELINE_STATE_STORE's default) and its stores; a temporary
    STATE_DIR goes with `owner`."""
    values = {"state_store": os.environ.get("PIPELINE_STATE_STORE", "memory"), **values}
    temporary = None
    if values["state_store"] == "disk" and not values.get("state_dir"):
        values["state_dir"] = temporary = tempfile.mkdtemp(prefix="driver-state-")
    settings = settings_module.load(env={}, **values)
    local = local_stores(app, settings, settings.app_id or app.name)
    if local is not None:
        weakref.finalize(owner, _close, local, temporary)
    return settings, DriverStores(local)


def _close(local: LocalStores, temporary: str | None) -> None:
    local.close()
    if temporary is not None:
        shutil.rmtree(temporary, ignore_errors=True)
