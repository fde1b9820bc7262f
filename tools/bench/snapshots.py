"""Benchmarks of full snapshots (not timed tests): restore from a snapshot + tail vs the whole changelog, and the
compaction job's throughput. Needs a broker (default 127.0.0.1:9092) and the Spark connector jars.

    python -m tools.bench.snapshots                       # 1 M keys, 100 k tail, histories 1x and 10x (10 M records)
    python -m tools.bench.snapshots --history 2           # a smaller 10x stand-in on a busy machine
    python -m tools.bench.snapshots --keys 100000 --tail 10000 --history 3    # a smoke run

For each history h in (1, --history): a fresh app whose changelog partition 0 holds h rounds over all keys (each
round writes every key once, in transactions of 10 000 changes + a checkpoint, like the pipeline's commits), then
`snapshots compact` on local[2] (timed: records/s end to end, Kafka in and out), then a tail of --tail changes
(10 % deletes). Then, with Spark stopped, each app's partition is restored from a cold start (a new consumer, a new
PartitionState) twice: snapshot + tail, and the whole changelog with no snapshot topic.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.clients import produce_waiting
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG
from pipeline.state import PartitionState
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.state.restore import ChangelogRestore
from snapshots.compact import Options, compact

TXN_RECORDS = 10_000


@dataclass
class App:
    app_id: str
    history: int
    changelog_records: int = 0
    next_input: int = 0
    compaction_s: float = 0.0
    compaction_records: int = 0


def create(bootstrap: str, history: int) -> App:
    app = App(f"bench-snap-{history}x-{uuid.uuid4().hex[:6]}", history)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(f"{app.app_id}-changelog", 1, 1, config=CHANGELOG_CONFIG),
        NewTopic(f"{app.app_id}-snapshots", 1, 1, config=SNAPSHOT_CONFIG),
    ]
    for future in admin.create_topics(topics).values():
        future.result(30)
    return app


def write(bootstrap: str, app: App, changes, total: int) -> None:
    """Writes (key, value|None) changes to partition 0 in transactions of TXN_RECORDS + a checkpoint."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{app.app_id}.bench",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    producer.init_transactions(30)
    topic = f"{app.app_id}-changelog"
    started = time.monotonic()
    in_txn = 0
    producer.begin_transaction()
    for key, value in changes:
        produce_waiting(producer, topic, value, key, partition=0)
        in_txn += 1
        if in_txn == TXN_RECORDS:
            app.next_input += in_txn
            producer.produce(
                topic,
                Checkpoint("bench-in", 0, app.next_input).encode(),
                CHECKPOINT_KEY,
                partition=0,
                headers=[CHECKPOINT_HEADER],
            )
            producer.commit_transaction(60)
            app.changelog_records += in_txn + 1
            in_txn = 0
            producer.begin_transaction()
    app.next_input += in_txn
    producer.produce(
        topic,
        Checkpoint("bench-in", 0, app.next_input).encode(),
        CHECKPOINT_KEY,
        partition=0,
        headers=[CHECKPOINT_HEADER],
    )
    producer.commit_transaction(60)
    app.changelog_records += in_txn + 1
    log(f"{app.app_id}: wrote {total} changes in {time.monotonic() - started:.1f}s")


def history(keys: int, rounds: int):
    for r in range(rounds):
        for k in range(keys):
            yield b"account-%07d" % k, b"[%d,%d]" % (r + 1, k * (r + 1))


def tail(keys: int, n: int):
    for i in range(n):
        k = (i * 7919) % keys
        yield b"account-%07d" % k, (None if i % 10 == 0 else b"[%d,%d]" % (i, i))


def restore(bootstrap: str, app: App, with_snapshot: bool) -> dict:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    state = PartitionState()

    def consumer() -> Consumer:  # the runner's restore consumer
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{app.app_id}.restore",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "fetch.wait.max.ms": 10,
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
            }
        )

    started = time.monotonic()
    job = ChangelogRestore(
        consumer,
        admin,
        f"{app.app_id}-changelog",
        0,
        state,
        app.next_input,
        3600,
        30,
        snapshot_topic=f"{app.app_id}-snapshots" if with_snapshot else None,
    )
    steps, longest = 0, 0.0
    while True:
        step_started = time.monotonic()
        done = job.step(0.2)  # the runner's default restore_step_ms
        longest = max(longest, time.monotonic() - step_started)
        steps += 1
        if done:
            break
    seconds = time.monotonic() - started
    job.close()
    return {
        "app": app.app_id,
        "history": app.history,
        "snapshot": with_snapshot,
        "seconds": round(seconds, 2),
        "keys": len(state),
        "snapshot_entries": job.snapshot_entries,
        "changelog_records": job.records,
        "steps": steps,
        "longest_step_s": round(longest, 3),
        "snapshot_s": round(job.snapshot_seconds, 2),
        "tail_s": round(job.tail_seconds, 2),
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.snapshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=10, help="rounds of the long history (the 10x case)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--keep-topics", action="store_true", help="do not delete the apps' topics at the end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    bootstrap = args.bootstrap_servers

    apps = []
    for rounds in sorted({1, args.history}):
        app = create(bootstrap, rounds)
        write(bootstrap, app, history(args.keys, rounds), args.keys * rounds)
        apps.append(app)

    from snapshots.spark_session import local_spark_session

    spark = local_spark_session("snapshots-bench", args.master)
    results: dict = {"keys": args.keys, "tail": args.tail, "compaction": [], "restore": []}
    try:
        for app in apps:
            started = time.monotonic()
            report = compact(spark, Options(bootstrap, app.app_id, timeout_s=60))
            app.compaction_s = time.monotonic() - started
            app.compaction_records = report.partitions[0].changelog_records
            rate = app.compaction_records / app.compaction_s
            log(f"compaction {app.history}x: {report.summary()}")
            results["compaction"].append(
                {
                    "history": app.history,
                    "records": app.compaction_records,
                    "seconds": round(app.compaction_s, 1),
                    "records_per_s": round(rate),
                }
            )
    finally:
        spark.stop()
    for app in apps:
        write(bootstrap, app, tail(args.keys, args.tail), args.tail)
    for app in apps:
        for with_snapshot in (True, False):
            result = restore(bootstrap, app, with_snapshot)
            results["restore"].append(result)
            log(f"restore: {result}")

    print("\ncompaction (local[2], Kafka in and out):")
    for c in results["compaction"]:
        print(
            f"  {c['history']:>2}x history: {c['records']:>10} changelog records in {c['seconds']:>6}s = "
            f"{c['records_per_s']:>8} records/s"
        )
    print("restore (cold start, one partition):")
    base = {r["history"]: r for r in results["restore"] if r["snapshot"]}
    for r in results["restore"]:
        what = "snapshot + tail" if r["snapshot"] else "whole changelog"
        rates = f" (changelog {r['changelog_records'] / max(r['tail_s'], 1e-9):,.0f} records/s)"
        if r["snapshot"]:
            rates = (
                f" (snapshot {r['snapshot_s']}s = {r['snapshot_entries'] / max(r['snapshot_s'], 1e-9):,.0f} "
                f"entries/s, tail {r['tail_s']}s = {r['changelog_records'] / max(r['tail_s'], 1e-9):,.0f} "
                "records/s)"
            )
        print(
            f"  {r['history']:>2}x history, {what:<16}: {r['seconds']:>6}s, {r['keys']} keys, "
            f"{r['snapshot_entries']} snapshot entries + {r['changelog_records']} changelog records, longest step "
            f"{r['longest_step_s']}s{rates}"
        )
    if len(base) == 2:
        low, high = sorted(base)
        print(f"  snapshot restore {high}x vs {low}x history: {base[high]['seconds'] / base[low]['seconds']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if not args.keep_topics:  # a 10x history is a gigabyte on the broker's disk
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [f"{app.app_id}-{kind}" for app in apps for kind in ("changelog", "snapshots")]
        for future in admin.delete_topics(topics, request_timeout=30).values():
            future.result(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
