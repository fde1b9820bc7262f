"""Records/s of order_fills (two co-partitioned inputs merged by timestamp, a global table) on the PostgreSQL sink
(order_fills_pg: per batch one database transaction with every topic's offsets row and a merge-order row) against
the Kafka exactly-once sink (order_fills), on the same input, in-process, as tools/bench/postgres.py measures
running totals (the same window: from 10% to 90% of the records committed).

    python -m tools.bench.pg_inputs --dsn postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline
    python -m tools.bench.pg_inputs --records 30000 --batches 1000 --modes pg
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import uuid

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from pipeline.app import App
from pipeline.examples import order_fills, order_fills_pg
from pipeline.settings import Settings
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.postgres.runner import PostgresRunner
from pipeline.testing.faults import produce_paced
from pipeline.testing.inputs import create_topics
from tools.bench.postgres import DEFAULT_DSN, HEADER, PARTITIONS, Result, measure


def run_one(mode: str, batch: int, args: argparse.Namespace, suffix: str, total: int) -> Result:
    app_id = f"bench-fills-{mode}-{batch}-{uuid.uuid4().hex[:8]}"
    common = {
        "bootstrap_servers": args.bootstrap_servers,
        "app_id": app_id,
        "topic_suffix": suffix,
        "commit_max_records": batch,
        "poll_max_records": batch,
        "commit_interval_ms": 2000,
        "processing_backoff_ms": 0,  # ~1% of the fills are malformed: their retries' back-off would be what is measured
    }
    runner: PostgresRunner | KafkaRunner
    schema = f"bench_{uuid.uuid4().hex[:8]}" if mode == "pg" else None
    if schema:
        settings = Settings(**common, sink="postgres", postgres_dsn=args.dsn, postgres_schema=schema)
        runner = PostgresRunner(order_fills_pg.app, settings)
    else:
        runner = KafkaRunner(order_fills.app, Settings(**common))
    streams = [s.topic for s in runner.app.streams]

    def committed() -> int:  # the streams' committed offsets, summed over partitions (the table is read whole)
        tasks = list(runner.tasks.values())
        return sum(getattr(t, "committed_offsets", {}).get(topic) or 0 for t in tasks for topic in streams)

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
            AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics(
                [f"{app_id}-changelog", f"{app_id}-dlq"]
            )


def prepare(args: argparse.Namespace, suffix: str) -> tuple[App, int]:
    """The topics of both Apps (the same names: order_fills_pg reads order_fills' topics), filled once."""
    app = order_fills.app.with_topic_suffix(suffix)
    streams = [s.topic for s in app.streams]
    create_topics(args.bootstrap_servers, {t: PARTITIONS for t in [*streams, app.output_topic]})
    tables = [t.topic for t in app.global_table_specs.values()]
    create_topics(args.bootstrap_servers, dict.fromkeys(tables, PARTITIONS), config={"cleanup.policy": "compact"})
    records = [(f"{topic}{suffix}", *rest) for topic, *rest in order_fills.generate(args.records, PARTITIONS, 7)]
    produce_paced(args.bootstrap_servers, None, records, 0)
    return app, sum(1 for r in records if r[0] in streams)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.pg_inputs", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--dsn", default=os.environ.get("POSTGRES_DSN", DEFAULT_DSN))
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--batches", default="100,1000")
    parser.add_argument("--modes", default="pg,eos")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level="ERROR")  # not one WARNING per dead letter
    suffix = f"-bench-{uuid.uuid4().hex[:8]}"
    app, total = prepare(args, suffix)
    print(
        f"input: {total} order_fills orders and fills in {PARTITIONS} partitions (suffix {suffix}); load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(HEADER)
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            for mode in args.modes.split(","):
                print(run_one(mode, batch, args, suffix, total).row(), flush=True)
    finally:
        topics = [*app.co_partitioned, app.output_topic, *(t.topic for t in app.global_table_specs.values())]
        AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics(topics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
