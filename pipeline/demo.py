"""`make demo`: two running-totals instances, one killed with SIGKILL midway, the other takes over; then the
checker's verdict and the survivor's metrics."""

from __future__ import annotations

import os
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from pipeline import checker
from pipeline.examples import inputs
from pipeline.examples.running_totals import app
from pipeline.harness import Fleet, group_owners, wait_caught_up

RECORDS = 60_000
PARTITIONS = 3
METRICS_PORTS = (9464, 9465)
SHOWN_METRICS = ("pipeline_records_in_total", "pipeline_transactions_total", "pipeline_commit_latency_seconds_count",
                 "pipeline_commit_latency_seconds_sum", "pipeline_restore_records_total", "pipeline_dead_letters_total")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> None:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    suffix = uuid.uuid4().hex[:6]
    app_id, source, sink = f"demo-{suffix}", f"demo-in-{suffix}", f"demo-out-{suffix}"
    inputs.create_topics(bootstrap, {source: PARTITIONS, sink: PARTITIONS})
    inputs.produce_running_totals(bootstrap, source, RECORDS, partitions=PARTITIONS, poison_every=10_000)
    say(f"produced {RECORDS} running-totals records to {source} ({PARTITIONS} partitions, 1 in 10000 is poison)")

    env = {"PIPELINE_APP_ID": app_id, "PIPELINE_INPUT_TOPIC": source, "PIPELINE_OUTPUT_TOPIC": sink,
           "PIPELINE_KAFKA_QUEUED_MAX_MESSAGES_KBYTES": "4096"}
    fleet = Fleet("pipeline.examples.running_totals:app", bootstrap, env, Path(tempfile.mkdtemp(prefix="demo-")))
    victim, _survivor = (fleet.start(1, PIPELINE_METRICS_PORT=str(port))[0] for port in METRICS_PORTS)
    say(f"started two instances; logs in {fleet.log_dir}")
    time.sleep(3)
    say(f"partitions before the crash: {group_owners(bootstrap, app_id)}")
    victim.kill()
    say(f"SIGKILL {victim.name} in the middle of its transactions")
    lag = wait_caught_up(bootstrap, app_id, source, PARTITIONS, 120)
    say(f"partitions after take-over: {group_owners(bootstrap, app_id)}; remaining lag {lag or 0}")
    print_metrics(METRICS_PORTS[1])
    fleet.stop_all()

    verdict = checker.verify(app, bootstrap, input_topic=source, output_topic=sink, dead_letter_topic=f"{app_id}-dlq",
                             changelog_topic=f"{app_id}-changelog", group_id=app_id)
    print(verdict.summary())
    raise SystemExit(0 if verdict.ok else 1)


def print_metrics(port: int) -> None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    say(f"metrics of the survivor (http://127.0.0.1:{port}/metrics):")
    for line in text.splitlines():
        if line.startswith(SHOWN_METRICS):
            print("   ", line)


if __name__ == "__main__":
    main()
