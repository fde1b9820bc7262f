"""Interactive queries of the PostgreSQL sink (pipeline/sinks/postgres/queries.py) on a real broker and a real
PostgreSQL: two instances share three partitions, and each is asked for a key of every partition while the input
flows. A partition it runs is answered from memory, any other from the tables; every answer must be the state the
input's records below the offset it names give (folded here from the produced records), never a batch not yet
committed, and with the same JSON shape either way.

Red on purpose: without the tables' reads an instance answers 503 for a partition it does not run, and the test
finds a partition one of them never answered."""

from __future__ import annotations

import http.client
import socket
import time
from collections import defaultdict
from typing import Any

import orjson
import pytest

from pipeline.testing import inputs
from tests.postgres.conftest import PARTITIONS, assert_exactly_once, totals_input
from tests.support import eventually

pytestmark = pytest.mark.postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask(port: int, path: str) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        raw = response.read()
        json = response.getheader("Content-Type") == "application/json"
        return response.status, orjson.loads(raw) if json and raw else {}
    except (OSError, http.client.HTTPException):
        return 0, {}
    finally:
        connection.close()


def folded(records: list[inputs.ProducedRecord]) -> dict[tuple[int, str], list[tuple[int, list[int]]]]:
    """(partition, account) -> (input offset, [count, sum] after it), in offset order: running_totals' state."""
    history: dict[tuple[int, str], list[tuple[int, list[int]]]] = defaultdict(list)
    offsets: dict[int, int] = defaultdict(int)
    totals: dict[tuple[int, str], list[int]] = {}
    for p, key, value in records:
        account, amount = key.decode(), orjson.loads(value)["amount"]
        count, total = totals.get((p, account), [0, 0])
        totals[(p, account)] = [count + 1, total + amount]
        history[(p, account)].append((offsets[p], totals[(p, account)]))
        offsets[p] += 1
    return history


def test_every_instance_answers_every_partition_with_committed_state(pg_run):
    ports = [free_port(), free_port()]
    run = pg_run(query_enabled="true", query_partitioner="crc32", commit_interval_ms="200")
    records = totals_input(12_000, seed=21)
    run.feed(records, seconds=10)
    fleet = run.start(0)
    for port in ports:
        fleet.start(1, PIPELINE_METRICS_PORT=str(port), PIPELINE_QUERY_ADDRESS=f"127.0.0.1:{port}")
    keys = {p: next(k.decode() for q, k, _ in records if q == p) for p in range(PARTITIONS)}
    eventually(lambda: all(ask(port, "/ready")[0] == 200 for port in ports), 60, 0.2)
    answers: list[tuple[int, int, int | None, str, Any]] = []  # port, partition, offset, key, value
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        for port in ports:
            for p, key in keys.items():
                status, body = ask(port, f"/state/{key}?partition={p}")
                if status in (200, 404):
                    assert set(body) == {"key", "partition", "topic", "offset", "found", "value"}, body
                    answers.append((port, p, body["offset"], key, body["value"]))
                status, body = ask(port, f"/state?prefix=account-&limit=1000&partition={p}")
                if status == 200:
                    for entry in body["entries"]:
                        answers.append((port, p, body["offset"], entry["key"], entry["value"]))
        time.sleep(0.05)
    assert_exactly_once(run.finish(), run)
    served = {(port, p) for port, p, offset, _, _ in answers if offset}
    assert served == {(port, p) for port in ports for p in range(PARTITIONS)}, f"answered only {sorted(served)}"
    history = folded(records)
    wrong = []
    for port, p, offset, key, value in answers:
        expected = [v for o, v in history[(p, key)] if o < (offset or 0)]
        if value != (expected[-1] if expected else None):
            wrong.append((port, p, offset, key, value, expected[-1:]))
    assert not wrong, f"{len(wrong)} of {len(answers)} answers not the committed state at their offset: {wrong[:5]}"
    print(f"{len(answers)} values answered, every partition by both instances")
