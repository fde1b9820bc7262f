"""`make demo`: two running-totals instances, one killed with SIGKILL midway, the other takes over; the survivor's
metrics; then one compaction into full snapshots while the survivor runs, a SIGKILL of the survivor, and a fresh
instance that restores from the snapshots reading only the changelog tail; finally the checker's verdict."""

from __future__ import annotations

import os
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from pipeline.examples.running_totals import app
from pipeline.testing import checker, inputs
from pipeline.testing.harness import Fleet, group_owners, wait_caught_up

RECORDS = 60_000
PARTITIONS = 3
METRICS_PORTS = (9464, 9465)
SHOWN_METRICS = (
    "pipeline_records_in_total",
    "pipeline_transactions_total",
    "pipeline_commit_latency_seconds_count",
    "pipeline_commit_latency_seconds_sum",
    "pipeline_restore_records_total",
    "pipeline_restore_snapshot_entries_total",
    "pipeline_dead_letters_total",
)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> None:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    suffix = uuid.uuid4().hex[:6]
    app_id, source, sink = f"demo-{suffix}", f"demo-in-{suffix}", f"demo-out-{suffix}"
    inputs.create_topics(bootstrap, {source: PARTITIONS, sink: PARTITIONS})
    inputs.produce_running_totals(bootstrap, source, RECORDS, partitions=PARTITIONS, poison_every=10_000)
    say(f"produced {RECORDS} running-totals records to {source} ({PARTITIONS} partitions, 1 in 10000 is poison)")

    env = {
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": source,
        "PIPELINE_OUTPUT_TOPIC": sink,
        "PIPELINE_KAFKA_QUEUED_MAX_MESSAGES_KBYTES": "4096",
    }
    fleet = Fleet("pipeline.examples.running_totals:app", bootstrap, env, Path(tempfile.mkdtemp(prefix="demo-")))
    victim, survivor = (fleet.start(1, PIPELINE_METRICS_PORT=str(port))[0] for port in METRICS_PORTS)
    say(f"started two instances; logs in {fleet.log_dir}")
    time.sleep(3)
    say(f"partitions before the crash: {group_owners(bootstrap, app_id)}")
    victim.kill()
    say(f"SIGKILL {victim.name} in the middle of its transactions")
    lag = wait_caught_up(bootstrap, app_id, source, PARTITIONS, 120)
    say(f"partitions after take-over: {group_owners(bootstrap, app_id)}; remaining lag {lag or 0}")
    print_metrics(METRICS_PORTS[1])
    compact_and_restart(bootstrap, app_id, source, fleet, survivor)
    fleet.stop_all()

    verdict = checker.verify(
        app,
        bootstrap,
        input_topic=source,
        output_topic=sink,
        dead_letter_topic=f"{app_id}-dlq",
        changelog_topic=f"{app_id}-changelog",
        group_id=app_id,
    )
    print(verdict.summary())
    raise SystemExit(0 if verdict.ok else 1)


def compact_and_restart(bootstrap: str, app_id: str, source: str, fleet: Fleet, survivor) -> None:
    """Full snapshots: `snapshots compact` while the survivor runs; then the survivor dies and a fresh instance
    restores each partition from its snapshot plus the changelog tail written since."""
    from snapshots.compact import Options, compact
    from snapshots.spark_session import local_spark_session

    say("compacting each partition's changelog into a full snapshot (Spark local[2]); the survivor keeps running")
    spark = local_spark_session(f"{app_id}-compaction", "local[2]")
    try:
        report = compact(spark, Options(bootstrap, app_id))
    finally:
        spark.stop()
    print(report.summary())
    inputs.produce_running_totals(bootstrap, source, 3_000, partitions=PARTITIONS, seed=1)
    lag = wait_caught_up(bootstrap, app_id, source, PARTITIONS, 120)
    survivor.kill()
    say(
        f"the survivor processed 3000 more records (remaining lag {lag or 0}); SIGKILL {survivor.name}; starting a "
        "fresh instance"
    )
    fleet.start(1, PIPELINE_METRICS_PORT=str(METRICS_PORTS[0]))
    base = f"http://127.0.0.1:{METRICS_PORTS[0]}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # every partition restored (ready alone is true while none is assigned yet)
        try:
            restored = (
                urllib.request.urlopen(f"{base}/metrics", timeout=2)
                .read()
                .decode()
                .count("pipeline_restore_snapshot_entries_total{")
            )
            if restored == PARTITIONS and urllib.request.urlopen(f"{base}/ready", timeout=2).status == 200:
                break
        except OSError:  # not listening yet, or 503 while restoring
            pass
        time.sleep(0.5)
    say("the fresh instance restored every partition from its snapshot and read only the changelog tail since:")
    print_metrics(METRICS_PORTS[0], "the fresh instance")


def print_metrics(port: int, who: str = "the survivor") -> None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    say(f"metrics of {who} (http://127.0.0.1:{port}/metrics):")
    for line in text.splitlines():
        if line.startswith(SHOWN_METRICS):
            print("   ", line)


if __name__ == "__main__":
    main()
