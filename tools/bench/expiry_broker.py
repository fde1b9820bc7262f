"""`python -m tools.bench.expiry_broker`: order_expiry against order_fills on the real broker (issue 31).

The broker-free `tools.bench.expiry` measures CPU time per record; this runs both Apps in-process (KafkaRunner, the
exactly-once sink, per-process producers) on the same records in topics of their own (order_expiry.generate, 3
partitions, produced once under both Apps' topic names), the rate taken as tools/bench/postgres.py takes it (from
10 % to 90 % of the input committed). The two alternate, each on a fresh app id; medians. order_fills ignores the
orders' ttl_ms; its global accounts table is empty.

    python -m tools.bench.expiry_broker --records 60000 --repeat 3
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
import uuid

from confluent_kafka.admin import AdminClient

from pipeline.app import App
from pipeline.examples import order_expiry, order_fills
from pipeline.settings import Settings
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing.faults import produce_paced
from pipeline.testing.inputs import create_topics
from tools.bench.postgres import PARTITIONS, measure


def run_one(app: App, args: argparse.Namespace, suffix: str, total: int) -> float:
    """Records/s of one run of `app` over the prepared topics (a fresh app id: it reads them from the start)."""
    app_id = f"bench-{app.name}-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        bootstrap_servers=args.bootstrap_servers,
        app_id=app_id,
        topic_suffix=suffix,
        commit_max_records=args.batch,
        poll_max_records=args.batch,
        commit_interval_ms=2000,
        processing_backoff_ms=0,  # ~1 % of the fills are malformed: their retries' back-off would be what is measured
    )
    runner = KafkaRunner(app, settings)
    streams = [s.topic for s in runner.app.streams]

    def committed() -> int:
        tasks = list(runner.tasks.values())
        return sum(getattr(t, "committed_offsets", {}).get(topic) or 0 for t in tasks for topic in streams)

    thread = threading.Thread(target=runner.run, name=f"bench-{app.name}", daemon=True)
    thread.start()
    try:
        return measure(app.name, args.batch, total, committed, runner.metrics, thread, args.timeout).rate
    finally:
        runner.stop()
        thread.join(60)
        AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics(
            [f"{app_id}-changelog", f"{app_id}-dlq"]
        )


def prepare(args: argparse.Namespace, suffix: str) -> tuple[list[App], int]:
    """Both Apps' topics, each input holding order_expiry's generated records; the Apps (the runner adds the suffix)
    and the number of input records."""
    apps = [order_fills.app, order_expiry.app]
    for app in (a.with_topic_suffix(suffix) for a in apps):
        create_topics(args.bootstrap_servers, {t: PARTITIONS for t in [*app.co_partitioned, app.output_topic]})
        if tables := [t.topic for t in app.global_table_specs.values()]:
            config = {"cleanup.policy": "compact"}
            create_topics(args.bootstrap_servers, dict.fromkeys(tables, PARTITIONS), config=config)
    names = {
        order_expiry.ORDERS: [order_expiry.ORDERS, order_fills.ORDERS],
        order_expiry.FILLS: [order_expiry.FILLS, order_fills.FILLS],
    }
    generated = list(order_expiry.generate(args.records, PARTITIONS, 7))
    records = [(f"{name}{suffix}", *rest) for topic, *rest in generated for name in names[topic]]
    produce_paced(args.bootstrap_servers, None, records, 0)
    return apps, len(generated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.expiry_broker", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    logging.basicConfig(level="ERROR")  # not one WARNING per dead letter
    suffix = f"-bench-{uuid.uuid4().hex[:8]}"
    apps, total = prepare(args, suffix)
    print(f"input: {total} records in {PARTITIONS} partitions; load average {os.getloadavg()[0]:.1f}", flush=True)
    rates: dict[str, list[float]] = {app.name: [] for app in apps}
    try:
        for _ in range(args.repeat):
            for app in apps:
                rates[app.name].append(run_one(app, args, suffix, total))
                print(f"{app.name:14} {rates[app.name][-1]:10,.0f} rec/s", flush=True)
    finally:
        suffixed = [app.with_topic_suffix(suffix) for app in apps]
        topics = [t for app in suffixed for t in (*app.co_partitioned, app.output_topic)]
        topics += [t.topic for app in suffixed for t in app.global_table_specs.values()]
        AdminClient({"bootstrap.servers": args.bootstrap_servers}).delete_topics(topics)
    fills, expiry = (statistics.median(rates[app.name]) for app in apps)
    print(f"medians: order_fills {fills:,.0f} rec/s, order_expiry {expiry:,.0f} rec/s: {expiry / fills:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
