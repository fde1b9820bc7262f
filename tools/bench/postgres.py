"""Rows/s of the PostgreSQL sink against the Kafka exactly-once mode, on the same input, at given batch sizes.

One input topic (3 partitions) is filled once with running-totals records; then, for every batch size and mode, a
runner with a fresh app id reads all of it, in-process (its loop in a thread):
    pg   PostgresRunner, running_totals_pg: per batch one database transaction (offsets row with the epoch check,
         COPY into `outputs`, upsert into `totals`, upsert of the state rows)
    eos  KafkaRunner, running_totals: per batch one Kafka transaction (outputs, changelog, offsets)
"Batch size" is commit_max_records (and poll_max_records, so that a poll does not overshoot it by much); the commit
interval is long (2 s) so that batches are cut by size. The rate is taken over the middle of the run: from the
moment 10% of the records are committed to the moment 90% are, so start-up (group join, fencing) and the last
partial batches do not count. Committed = the sum over partitions of the next offset the runner committed.

    python -m tools.bench.postgres --dsn postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline
    python -m tools.bench.postgres --records 30000 --batches 100 --modes pg
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from pipeline.examples import running_totals, running_totals_pg
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.testing.inputs import create_topics, produce_running_totals

PARTITIONS = 3
DEFAULT_DSN = "postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline"


@dataclass
class Result:
    mode: str
    batch: int
    records: int
    rate: float  # committed records per second over the 10%..90% window
    mean_batch: float  # committed records per committed transaction
    seconds: float  # first record committed to the last one

    def row(self) -> str:
        return (
            f"| {self.mode:<4} | {self.batch:>5} | {self.records:>7} | {self.rate:>10,.0f} "
            f"| {self.mean_batch:>10,.0f} | {self.seconds:>7.1f} |"
        )


HEADER = (
    "| mode | batch | records | records/s  | mean batch | seconds |\n"
    "|------|------:|--------:|-----------:|-----------:|--------:|"
)


def committed_transactions(metrics: Metrics) -> int:
    return int(
        sum(
            s.value
            for m in metrics.transactions.collect()
            for s in m.samples
            if s.name.endswith("_total") and s.labels.get("outcome") == "committed"
        )
    )


def run_one(mode: str, batch: int, args: argparse.Namespace, topic: str, total: int) -> Result:
    suffix = uuid.uuid4().hex[:8]
    common = {
        "bootstrap_servers": args.bootstrap_servers,
        "app_id": f"bench-{mode}-{batch}-{suffix}",
        "input_topic": topic,
        "commit_max_records": batch,
        "poll_max_records": batch,
        "commit_interval_ms": 2000,
    }
    runner: PostgresRunner | KafkaRunner
    if mode == "pg":
        schema = f"bench_{suffix}"
        runner = PostgresRunner(
            running_totals_pg.app, Settings(**common, sink="postgres", postgres_dsn=args.dsn, postgres_schema=schema)
        )

        def committed() -> int:
            return sum(w.committed_offset or 0 for w in list(runner.tasks.values()))
    else:
        schema = None
        output = f"bench-pg-out-{suffix}"
        topics = [output, f"{common['app_id']}-changelog", f"{common['app_id']}-dlq"]
        create_topics(args.bootstrap_servers, {output: PARTITIONS})
        runner = KafkaRunner(running_totals.app, Settings(**common, output_topic=output))

        def committed() -> int:
            return sum(t.committed_offset or 0 for t in list(runner.tasks.values()))

    thread = threading.Thread(target=runner.run, name=f"bench-{mode}", daemon=True)
    thread.start()
    try:
        return measure(mode, batch, total, committed, runner.metrics, thread, args.timeout)
    finally:
        runner.stop()
        thread.join(60)
        if schema:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        else:
            AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics(topics)


def measure(
    mode: str,
    batch: int,
    total: int,
    committed: Callable[[], int],
    metrics: Metrics,
    thread: threading.Thread,
    timeout_s: float,
) -> Result:
    deadline = time.monotonic() + timeout_s
    samples: list[tuple[float, int]] = []
    while True:
        now, done = time.monotonic(), committed()
        samples.append((now, done))
        if done >= total:
            break
        if now > deadline or not thread.is_alive():
            raise RuntimeError(f"{mode} batch {batch}: {done}/{total} committed when it stopped or timed out")
        time.sleep(0.01)
    t10, c10 = next((t, c) for t, c in samples if c >= total * 0.1)
    t90, c90 = next((t, c) for t, c in samples if c >= total * 0.9)
    first = next(t for t, c in samples if c > 0)
    return Result(
        mode,
        batch,
        total,
        (c90 - c10) / max(t90 - t10, 1e-9),
        total / max(committed_transactions(metrics), 1),
        samples[-1][0] - first,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.postgres", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--dsn", default=os.environ.get("POSTGRES_DSN", DEFAULT_DSN))
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--batches", default="100,1000")
    parser.add_argument("--modes", default="pg,eos")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING")
    topic = f"bench-pg-in-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap_servers, {topic: PARTITIONS})
    counts = produce_running_totals(args.bootstrap_servers, topic, args.records, partitions=PARTITIONS)
    total = sum(counts.values())
    print(
        f"input: {total} running-totals records in {PARTITIONS} partitions ({topic}); load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(HEADER)
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            for mode in args.modes.split(","):
                print(run_one(mode, batch, args, topic, total).row(), flush=True)
    finally:
        AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics([topic])
    return 0


if __name__ == "__main__":
    sys.exit(main())
