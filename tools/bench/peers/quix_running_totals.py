"""Running totals in Quix Streams with processing_guarantee="exactly-once": the peer side of
`python -m tools.bench.peers`.

Runs in its own venv (.venv-quix: quixstreams 3.28.1 needs confluent-kafka < 2.13) as a plain script, so it imports
nothing of `pipeline`. The logic is pipeline/examples/running_totals.py: per account key, [count, sum] in a stateful
`apply` (Quix's RocksDB store, changelogged), output {"id", "count", "sum"} to the output topic under the same key.

Modes (one JSON line on stdout at the end; Quix's own logs go to stderr):
    bench    process --records input records, measured as `python -m tools.bench` measures the Runner: a sampler thread
             reads the count of processed records (Quix's on_message_processed callback) every 5 ms, from the first
             sample that sees progress until the count reaches --records; start-up, group join and the final
             commit are excluded. Then app.stop(): Quix commits its last checkpoint and exits.
    serve    run until killed (the caller SIGKILLs it once the group's committed offset reached the end).
    restore  start on an existing group and changelog (the caller deleted --state-dir): times from before
             Application() to Quix's "Beginning recovery check" / "Recovery process complete" log lines and to the
             first input record processed (the caller produced one new record), then app.stop().
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from quixstreams import Application

SAMPLE_S = 0.005


def running_total(value: dict, state) -> dict:  # state: quixstreams State, scoped to the message key
    amount = value["amount"]
    if not isinstance(amount, int):
        raise TypeError(f"amount must be an integer, got {amount!r}")
    count, total = state.get("totals", (0, 0))
    count, total = count + 1, total + amount
    state.set("totals", [count, total])
    return {"id": value["id"], "count": count, "sum": total}


class Progress:
    def __init__(self) -> None:
        self.count = 0
        self.first_at: float | None = None

    def on_processed(self, topic: str, partition: int, offset: int) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.count += 1


class RecoveryLog(logging.Handler):
    """Remembers when Quix logged the start and the end of its state recovery."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.began: float | None = None
        self.completed: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Beginning recovery check") and self.began is None:
            self.began = time.monotonic()
        elif message.startswith("Recovery process complete"):
            self.completed = time.monotonic()


def build(args: argparse.Namespace, progress: Progress) -> Application:
    options = {}
    if args.commit_interval is not None:
        options["commit_interval"] = args.commit_interval
    app = Application(
        broker_address=args.bootstrap_servers,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.state_dir,
        auto_create_topics=True,
        on_message_processed=progress.on_processed,
        loglevel="INFO",
        **options,
    )
    input_topic = app.topic(args.input_topic, key_deserializer="str", value_deserializer="json")
    output_topic = app.topic(args.output_topic, key_serializer="str", value_serializer="json")
    app.dataframe(input_topic).apply(running_total, stateful=True).to_topic(output_topic)
    return app


def measure(app: Application, progress: Progress, total: int, timeout_s: float, result: dict) -> None:
    """tools/bench/throughput.py's measure(), on Quix's processed count."""
    deadline = time.monotonic() + timeout_s
    first: tuple[float, int] | None = None
    try:
        while True:
            count, now = progress.count, time.monotonic()
            if first is None and count > 0:
                first = (now, count)
            if count >= total:
                break
            if now > deadline:
                result["error"] = f"timeout after {timeout_s:.0f}s at {count}/{total}"
                return
            time.sleep(SAMPLE_S)
        assert first is not None  # count reached total > 0
        elapsed = now - first[0]
        result.update(rate=(total - first[1]) / elapsed if elapsed > 0 else None, seconds=elapsed, processed=count)
    finally:
        app.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["bench", "serve", "restore"])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--group", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--commit-interval", type=float, help="seconds; Quix's default (5.0) when not given")
    parser.add_argument("--records", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    started = time.monotonic()
    progress = Progress()
    app = build(args, progress)
    recovery = RecoveryLog()  # after Application(): it configures the "quixstreams" logger only if it has no handler
    logging.getLogger("quixstreams").addHandler(recovery)
    result: dict = {"mode": args.mode}
    if args.mode == "bench":
        threading.Thread(target=measure, args=(app, progress, args.records, args.timeout, result), daemon=True).start()
    elif args.mode == "restore":
        threading.Thread(target=measure, args=(app, progress, 1, args.timeout, result), daemon=True).start()
    app.run()
    if args.mode == "restore":
        result.update(
            recovery_began_s=None if recovery.began is None else recovery.began - started,
            recovery_s=None
            if recovery.completed is None or recovery.began is None
            else recovery.completed - recovery.began,
            first_record_s=None if progress.first_at is None else progress.first_at - started,
        )
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
