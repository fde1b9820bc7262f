"""running_totals behind an import that takes SLOW_IMPORT_S: a worker that starts (and so beats) later than a 1.5 s
failure-detection bound, as a loaded machine makes one (tests/faults/test_supervised_workers.py)."""

from __future__ import annotations

import time

from pipeline.examples.running_totals import app

SLOW_IMPORT_S = 2.5
time.sleep(SLOW_IMPORT_S)

__all__ = ["app"]
