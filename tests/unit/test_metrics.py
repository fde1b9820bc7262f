"""HealthServer: /metrics (Prometheus text), /ready (503 until ready, then 200), /live."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from pipeline.core.lifecycle import Lifecycle
from pipeline.core.loop import PollLoop
from pipeline.metrics import HealthServer, Metrics
from pipeline.settings import ConfigError, Settings


class Readiness:
    def __init__(self) -> None:
        self.ready = False

    def __call__(self) -> bool:
        return self.ready


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Metrics, Readiness]]:
    """One server for the module: stopping one waits for its poll interval (0.5 s)."""
    metrics, readiness = Metrics(), Readiness()
    server = HealthServer(metrics, readiness, port=0, host="127.0.0.1").start()
    try:
        yield f"http://127.0.0.1:{server.port}", metrics, readiness
    finally:
        server.stop()


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers["Content-Type"], e.read()


def test_metrics_serves_prometheus_text(served: tuple[str, Metrics, Readiness]) -> None:
    base, metrics, _ = served
    metrics.records_in.labels("0").inc(3)
    metrics.records_out.labels("0").inc(2)
    metrics.transactions.labels("0", "committed").inc()
    metrics.dead_letters.inc()
    metrics.commit_latency.observe(0.02)
    status, content_type, body = get(base + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    text = body.decode()
    assert re.search(r"^# TYPE pipeline_records_in(_total)? counter$", text, re.MULTILINE)
    assert 'pipeline_records_in_total{partition="0"} 3.0' in text
    assert 'pipeline_records_out_total{partition="0"} 2.0' in text
    assert 'pipeline_transactions_total{outcome="committed",partition="0"} 1.0' in text
    assert "pipeline_dead_letters_total 1.0" in text
    assert "pipeline_commit_latency_seconds_count 1.0" in text
    for name in (
        "pipeline_fenced_partitions",
        "pipeline_processing_errors",
        "pipeline_restore_duration_seconds",
        "pipeline_consumer_lag",
        "pipeline_assigned_partitions",
        "pipeline_ready",
    ):
        assert f"# HELP {name}" in text


def test_ready_follows_the_callable(served: tuple[str, Metrics, Readiness]) -> None:
    base, _, readiness = served
    readiness.ready = False
    status, _, body = get(base + "/ready")
    assert (status, body) == (503, b"restoring\n")
    readiness.ready = True
    status, _, body = get(base + "/ready")
    assert (status, body) == (200, b"ready\n")
    readiness.ready = False
    assert get(base + "/ready")[0] == 503


def test_live_and_unknown_paths(served: tuple[str, Metrics, Readiness]) -> None:
    base, _, _ = served
    assert get(base + "/live")[:1] == (200,)
    assert get(base + "/live")[2] == b"live\n"
    assert get(base + "/nope")[0] == 404


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()  # no "Duplicated timeseries" error: several runners can live in one process
    a.records_in.labels("1").inc()
    assert b"pipeline_records_in_total" in a.exposition()
    assert b'pipeline_records_in_total{partition="1"}' not in b.exposition()


def test_live_is_503_once_the_poll_loop_stopped_turning() -> None:
    """/live follows the poll loop (pipeline/core/loop.py: PollLoop.is_live): turned within LIVE_TIMEOUT_MS, or not."""
    loop = PollLoop(Settings(live_timeout_ms=60_000))
    loop._turned_at = 100.0
    assert loop.is_live(now=159.9) and not loop.is_live(now=160.0)
    stuck = HealthServer(Metrics(), lambda: True, port=0, host="127.0.0.1", is_live=lambda: loop.is_live(now=200.0))
    stuck.start()
    try:
        status, _, body = get(f"http://127.0.0.1:{stuck.port}/live")
        assert (status, body) == (503, b"stuck: the poll loop stopped turning\n")
    finally:
        stuck.stop()


def test_live_timeout_must_exceed_the_longest_healthy_turn() -> None:
    with pytest.raises(ConfigError, match="LIVE_TIMEOUT_MS"):
        Settings(live_timeout_ms=40_000)  # 10 s transaction time-out + 4 x 10 s request time-out = 50 s
    derived = PollLoop(Settings(transaction_timeout_ms=30_000))  # 0: derived, 30 + 40 + 10 s
    derived._turned_at = 0.0
    assert derived.is_live(now=79.9) and not derived.is_live(now=80.0)


def test_the_poll_loop_sets_its_last_turn_with_its_gauges() -> None:
    """What the supervisor's /live reads of each worker (pipeline/supervisor.py: WorkerMetrics.stuck_pids)."""

    class Idle(PollLoop):
        def _owned_partitions(self) -> dict[int, Lifecycle]:
            return {}

    loop = Idle(Settings())
    before = time.time()
    loop._update_gauges()
    assert loop.metrics.loop_turned._value.get() >= before
