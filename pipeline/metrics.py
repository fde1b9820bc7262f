"""Prometheus metrics and the health endpoint (/metrics, /ready, /live) of one runner.

Under `pipeline run --workers N` each worker writes its metrics to PROMETHEUS_MULTIPROC_DIR and the supervisor serves
them merged (pipeline/supervisor.py): each gauge says how its workers' values combine (multiprocess_mode, ignored in a
single process)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pipeline.httpd import HttpServer, Respond

# Input record timestamp -> commit: a few ms (at_least_once), about the commit interval (exactly_once: 20 ms - 1 s
# are usual), minutes for a backlog worked off after a restart.
END_TO_END_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.records_in = Counter("pipeline_records_in", "Input records processed", ["partition"], registry=r)
        self.records_out = Counter("pipeline_records_out", "Output records produced", ["partition"], registry=r)
        self.transactions = Counter(
            "pipeline_transactions", "Transactions by outcome", ["partition", "outcome"], registry=r
        )
        self.commit_latency = Histogram(
            "pipeline_commit_latency_seconds",
            "Time to commit one transaction (offsets + commit)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        # Observed per transaction, not per record (a histogram observation per record would cost about as much as the
        # whole framework does per record): the latency of its first and of its last input record. With timestamps in
        # order within a partition, every record of the transaction lies between the two.
        self.end_to_end_latency = Histogram(
            "pipeline_end_to_end_latency_seconds",
            "Input record timestamp to the commit of its transaction, for the first and the last input record of each "
            "transaction",
            ["record"],
            buckets=END_TO_END_BUCKETS,
            registry=r,
        )
        self._end_to_end_first = self.end_to_end_latency.labels("first")
        self._end_to_end_last = self.end_to_end_latency.labels("last")
        self._partition_metrics(r)
        self.assigned = Gauge(
            "pipeline_assigned_partitions", "Input partitions owned", registry=r, multiprocess_mode="livesum"
        )
        # One sample per worker (pid label): the supervisor's /ready needs each one's.
        self.ready = Gauge(
            "pipeline_ready", "1 when every owned partition is restored", registry=r, multiprocess_mode="liveall"
        )
        # Wall clock, set at most once a second by the poll loop: the supervisor's /live needs each worker's.
        self.loop_turned = Gauge(
            "pipeline_loop_last_turn_timestamp_seconds",
            "When the poll loop last turned (Unix time, to within a second)",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.unowned = Gauge(
            "pipeline_unowned_partitions",
            "Input partitions that no member of the group has owned, in a stable group, for over SESSION_TIMEOUT_MS "
            "(every process counts the whole group's)",
            registry=r,
            multiprocess_mode="livemax",
        )

    def _partition_metrics(self, r: CollectorRegistry) -> None:
        """What happens to partitions and records: fences, losses, dead letters, errors, restores, lag."""
        self.fenced = Counter("pipeline_fenced_partitions", "Partitions dropped because fenced", registry=r)
        self.lost = Counter(
            "pipeline_lost_partitions", "Partitions lost without a revoke (membership expired)", registry=r
        )
        self.dead_letters = Counter("pipeline_dead_letters", "Records written to the dead-letter topic", registry=r)
        self.stopped = Gauge(
            "pipeline_stopped_partitions",
            "Owned partitions stopped (ON_POISON=stop, a mistake in the code, a dead-letter storm): need an operator",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.stalled = Gauge(
            "pipeline_stalled_partitions",
            "Owned partitions, not stopped, with input waiting (or a restore under way) that have not moved for "
            "STALL_WARNING_MS",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.standby_copies = Gauge(
            "pipeline_standby_partitions",
            "Standby copies of other members' partitions kept warm here (STANDBY_REPLICAS)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.processing_errors = Counter(
            "pipeline_processing_errors", "Failed attempts to decode or process a record", ["partition"], registry=r
        )
        # Per partition: the value of the partition's latest owner (a worker that gave it up keeps its own last one).
        self.restore_seconds = Gauge(
            "pipeline_restore_duration_seconds",
            "Duration of the last restore",
            ["partition"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.restore_records = Counter(
            "pipeline_restore_records", "Changelog records read by restores", ["partition"], registry=r
        )
        self.restore_snapshot_entries = Counter(
            "pipeline_restore_snapshot_entries",
            "State entries taken from full snapshots by restores",
            ["partition"],
            registry=r,
        )
        self.lag = Gauge(
            "pipeline_consumer_lag",
            "Records up to the high watermark not processed yet (from the consumer position, past commit markers)",
            ["partition"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self._table_metrics(r)

    def _table_metrics(self, r: CollectorRegistry) -> None:
        """Several inputs and tables (docs/inputs.md): lag per input, and per table its size, restore and lag."""
        self.input_lag = Gauge(
            "pipeline_input_lag",
            "pipeline_consumer_lag per input topic (inputs and co-partitioned tables)",
            ["topic", "partition"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.table_entries = Gauge(
            "pipeline_table_entries", "Keys held, per global table", ["table"], registry=r, multiprocess_mode="liveall"
        )
        self.table_lag = Gauge(
            "pipeline_table_lag",
            "Records of a global table's topic not read yet (high watermark minus position, all partitions)",
            ["table"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self.table_restore_seconds = Gauge(
            "pipeline_table_restore_duration_seconds",
            "Duration of a global table's restore",
            ["table"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self.table_restore_records = Counter(
            "pipeline_table_restore_records", "Records read by global table restores", ["table"], registry=r
        )

    def observe_table_restore(self, table: str, seconds: float, records: int, entries: int) -> None:
        self.table_restore_seconds.labels(table).set(seconds)
        self.table_restore_records.labels(table).inc(records)
        self.table_entries.labels(table).set(entries)

    def table_gauges(self, table: str, entries: int, lag: int) -> None:
        self.table_entries.labels(table).set(entries)
        self.table_lag.labels(table).set(lag)

    def observe_restore(self, partition: int, seconds: float, records: int, snapshot_entries: int = 0) -> None:
        """A finished restore of `partition`: how long it took, the changelog records (or rows) it read, and the
        state entries it took from a full snapshot."""
        label = str(partition)
        self.restore_seconds.labels(label).set(seconds)
        self.restore_records.labels(label).inc(records)
        self.restore_snapshot_entries.labels(label).inc(snapshot_entries)

    def observe_end_to_end(self, first_timestamp_ms: int, last_timestamp_ms: int) -> None:
        """Right after a commit: the latency of the transaction's first and last input record, from their Kafka
        timestamps (one without a timestamp is skipped). Never negative: the producer's clock may run ahead."""
        now_ms = time.time() * 1000
        if first_timestamp_ms > 0:
            self._end_to_end_first.observe(max(0.0, now_ms - first_timestamp_ms) / 1000)
        if last_timestamp_ms > 0:
            self._end_to_end_last.observe(max(0.0, now_ms - last_timestamp_ms) / 1000)

    def forget_partition(self, partition: int, topics: Sequence[str] = ()) -> None:
        """Drops the per-partition gauges of a partition this process no longer owns (its new owner reports them);
        `topics`: every topic its task read."""
        for gauge in (self.lag, self.restore_seconds):
            with contextlib.suppress(KeyError):
                gauge.remove(str(partition))
        for topic in topics:
            with contextlib.suppress(KeyError):
                self.input_lag.remove(topic, str(partition))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Exposition(Protocol):
    def exposition(self) -> bytes: ...


# Another GET handler on the same port (interactive queries, pipeline/core/queries.py): (path, request headers by
# lower-case name) -> (status, body, response headers with Content-Type), or None for a path it does not serve.
Routes = Callable[[str, Mapping[str, str]], tuple[int, bytes, Mapping[str, str]] | None]


class HealthServer:
    """Serves /metrics, /ready (200 when ready, else 503) and /live (200 while `is_live()`, else 503: the poll loop
    stopped turning) on a background thread; `routes` may serve other paths."""

    def __init__(
        self,
        metrics: Exposition,
        is_ready: Callable[[], bool],
        port: int,
        host: str = "0.0.0.0",
        is_live: Callable[[], bool] = lambda: True,
        routes: Routes | None = None,
    ) -> None:
        self._server = HttpServer(host, port, _respond(metrics, is_ready, is_live, routes), name="health")

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> HealthServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


def _respond(
    metrics: Exposition, is_ready: Callable[[], bool], is_live: Callable[[], bool], routes: Routes | None
) -> Respond:
    """The answer to a GET of `path`: the health paths here, the others from `routes`, else 404."""
    text = {"Content-Type": "text/plain"}

    def respond(path: str, headers: Mapping[str, str]) -> tuple[int, bytes, Mapping[str, str]]:
        if path == "/metrics":
            return 200, metrics.exposition(), {"Content-Type": CONTENT_TYPE_LATEST}
        if path == "/ready":
            ready = is_ready()
            return (200, b"ready\n", text) if ready else (503, b"restoring\n", text)
        if path == "/live":
            live = is_live()
            return (200, b"live\n", text) if live else (503, b"stuck: the poll loop stopped turning\n", text)
        if routes is not None and (routed := routes(path, headers)) is not None:
            return routed
        return 404, b"not found\n", text

    return respond
