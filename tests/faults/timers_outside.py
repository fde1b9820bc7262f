"""Test double: windowed_totals with its timer entries kept out of the changelog, so outside the transaction that
commits the outputs and offsets. In `pipeline run` processes only (the test process imports it too, to check the
run, and must stay unpatched): PartitionState.changes leaves out the __eos.timer keys."""

from __future__ import annotations

import sys

from pipeline.examples.windowed_totals import app
from pipeline.state.store import PartitionState

__all__ = ["app"]

if getattr(sys.modules["__main__"].__spec__, "name", "") == "pipeline.__main__":
    _changes = PartitionState.changes
    PartitionState.changes = lambda self: (
        (key, value)
        for key, value in _changes(self)  # type: ignore[method-assign]
        if not key.startswith("__eos.timer")
    )
