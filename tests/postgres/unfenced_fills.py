"""Test double: order_fills_pg with the epoch check removed from every write transaction (tests/postgres/unfenced.py
patches PostgresTask.advance_offset, which the several-input task's commit calls first). A zombie's late batch then
commits. Never use this outside tests."""

from __future__ import annotations

import tests.postgres.unfenced  # noqa: F401  (patches PostgresTask on import)
from pipeline.examples.order_fills_pg import app  # noqa: F401  (the App this module is loaded for)
