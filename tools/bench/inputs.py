"""`python -m tools.bench.inputs`: what several inputs and tables cost (docs/inputs.md; the Apps: input_apps.py).

throughput  two co-partitioned inputs merged by timestamp against one input, the same records in total (100-byte
            records, 3 partitions, timestamps of the two inputs interleaved), the exactly-once copier in-process
            (KafkaRunner, per-process producers, 100 ms commits); the rate taken from records_in as `python -m
            tools.bench` takes it. The two shapes alternate, each on fresh topics; medians.
global      a global table of K keys (JSON values of ~40 bytes) restored in a fresh process: seconds, and the resident
            memory the table adds per key.
lookup      end-to-end latency (produce -> visible to a read_committed reader) at a paced rate, every record looking up
            a co-partitioned table, or a global table, against the plain copier at the same rate; each a `pipeline
            run` process (tools/bench/latency.py's producer and reader). The three alternate; medians of p50 / p99.

    python -m tools.bench.inputs                                   # all three (about 15 minutes on 2 cores)
    python -m tools.bench.inputs --only throughput --records 300000 --repeat 5
    python -m tools.bench.inputs --only global --keys 1000000
    python -m tools.bench.inputs --only lookup --rate 5000 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pipeline import settings as settings_module
from pipeline.app import App, Table
from pipeline.kafka.clients import restore_consumer_config
from pipeline.metrics import Metrics
from pipeline.serde import JSON, STRING
from pipeline.settings import PER_PROCESS
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.state.global_tables import GlobalTables
from pipeline.testing.inputs import create_topics
from tools.bench import input_apps, latency
from tools.bench.big_state import in_fresh_process, rss_bytes
from tools.bench.throughput import BenchError, Worker, load_line, measure, records_in

log = logging.getLogger("tools.bench.inputs")

PARTITIONS = 3
VALUE = b"v" * 100
ROOT = Path(__file__).resolve().parents[2]


# -- topics ------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def fresh_topics(bootstrap: str, names: list[str]) -> Iterator[str]:
    """A suffix for this run: the App's topics with it are created (3 partitions) and deleted after, with the group."""
    suffix = f"-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {f"{name}{suffix}": PARTITIONS for name in names})
    try:
        yield suffix
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [t for t in admin.list_topics(timeout=30).topics if t.endswith(suffix) or suffix[1:] in t]
        futures = [*admin.delete_topics(topics, operation_timeout=30).values()] if topics else []
        futures += admin.delete_consumer_groups([f"bench-inputs{suffix}"], request_timeout=30).values()
        for future in futures:
            with contextlib.suppress(KafkaException):
                future.result(timeout=30)


def produce(bootstrap: str, records: Iterator[tuple[str, int, bytes, bytes]]) -> int:
    """(topic, partition, key, value) as fast as the producer takes them; the count."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    n = 0
    for topic, partition, key, value in records:
        while True:
            try:
                producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise BenchError("the producer did not flush in 120 s")
    return n


def fill_table(bootstrap: str, topic: str, keys: int, every_partition: bool) -> int:
    """k0 .. k<keys-1>: in every partition (a co-partitioned table read by offset) or spread over them (global)."""
    value = json.dumps({"price": "101.25", "desk": "rates-7", "version": 3}).encode()
    copies = range(PARTITIONS) if every_partition else (None,)
    return produce(
        bootstrap,
        ((topic, i % PARTITIONS if c is None else c, f"k{i}".encode(), value) for i in range(keys) for c in copies),
    )


# -- throughput --------------------------------------------------------------------------------------------------------
def throughput_once(bootstrap: str, app: App, records: int, timeout_s: float) -> float | None:
    with fresh_topics(bootstrap, [input_apps.A, input_apps.B, input_apps.OUT]) as suffix:
        topics = [f"{s.topic}{suffix}" for s in app.streams]
        produce(bootstrap, ((topics[i % len(topics)], i % PARTITIONS, b"k%d" % i, VALUE) for i in range(records)))
        settings = settings_module.load(
            env={},
            bootstrap_servers=bootstrap,
            app_id=f"bench-inputs{suffix}",
            topic_suffix=suffix,
            producers=PER_PROCESS,
            commit_interval_ms=100,
        )
        runner = KafkaRunner(app, settings)
        worker = Worker(runner.run, f"runner-{app.name}")
        try:
            return measure(lambda: records_in(runner.metrics), records, worker, timeout_s).rate
        except BenchError as e:
            log.error("%s: %s", app.name, e)
            return None
        finally:
            runner.stop()
            worker.join(30)


def bench_throughput(bootstrap: str, records: int, repeat: int) -> list[str]:
    rates: dict[str, list[float]] = {"one": [], "two": []}
    for round_ in range(repeat):
        for name, app in (("one", input_apps.one), ("two", input_apps.two)):
            rate = throughput_once(bootstrap, app, records, timeout_s=120 + records / 2_000)
            log.info(
                "throughput round %d, %s input(s): %s records/s", round_ + 1, name, f"{rate:,.0f}" if rate else "-"
            )
            if rate:
                rates[name].append(rate)
    if not rates["one"] or not rates["two"]:
        return ["throughput: a shape never finished (see the log)"]
    one, two = statistics.median(rates["one"]), statistics.median(rates["two"])
    return [
        f"throughput, {records:,} records, exactly-once copier, per-process producers, medians of {repeat}:",
        f"  one input   {one:>9,.0f} records/s   runs {', '.join(f'{r:,.0f}' for r in rates['one'])}",
        f"  two inputs  {two:>9,.0f} records/s   runs {', '.join(f'{r:,.0f}' for r in rates['two'])}",
        f"  two / one   {two / one:.2f}x   (target >= 0.8x: {'met' if two / one >= 0.8 else 'NOT met'})",
    ]


# -- global table restore ----------------------------------------------------------------------------------------------
def restore_global(bootstrap: str, topic: str) -> dict:
    """In a fresh process: the table read to its end, as the runner does before it joins the group."""
    settings = settings_module.load(env={}, bootstrap_servers=bootstrap, app_id="bench-inputs-global")
    make_consumer = lambda: Consumer(restore_consumer_config(settings, "bench-inputs-global"))  # noqa: E731
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tables = GlobalTables({"g": Table(topic, STRING, JSON)}, make_consumer, admin, Metrics(), 30, 600)
    gc.collect()
    before, started = rss_bytes(), time.monotonic()
    tables.restore()
    seconds = time.monotonic() - started
    gc.collect()
    keys = len(tables.tables["g"].data)
    tables.close()
    return {"seconds": seconds, "keys": keys, "rss_added": rss_bytes() - before}


def bench_global(bootstrap: str, keys: int, repeat: int) -> list[str]:
    with fresh_topics(bootstrap, [input_apps.GLOBAL]) as suffix:
        topic = f"{input_apps.GLOBAL}{suffix}"
        fill_table(bootstrap, topic, keys, every_partition=False)
        runs = [in_fresh_process(restore_global, bootstrap, topic) for _ in range(repeat)]
    seconds = statistics.median(r["seconds"] for r in runs)
    per_key = statistics.median(r["rss_added"] / max(r["keys"], 1) for r in runs)
    return [
        f"global table restore, {runs[0]['keys']:,} keys, medians of {repeat} fresh processes:",
        f"  {seconds:.1f} s ({runs[0]['keys'] / seconds:,.0f} keys/s); resident memory added {per_key:.0f} bytes/key"
        "   runs " + ", ".join(f"{r['seconds']:.1f} s" for r in runs),
    ]


# -- lookup latency ----------------------------------------------------------------------------------------------------
@dataclass
class Served:
    """A `pipeline run` process of one of input_apps' Apps, on topics with `suffix`."""

    process: subprocess.Popen
    log_path: Path

    @classmethod
    def start(cls, bootstrap: str, app: str, suffix: str, log_dir: Path) -> Served:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PIPELINE_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_APP_ID": f"bench-inputs{suffix}",
            "PIPELINE_TOPIC_SUFFIX": suffix,
            "PIPELINE_COMMIT_INTERVAL_MS": "100",
            "PIPELINE_METRICS_PORT": str(port),
        }
        log_path = log_dir / f"{app}{suffix}.log"
        with open(log_path, "wb") as out:
            command = [
                sys.executable,
                "-m",
                "pipeline",
                "--log-level",
                "warning",
                "run",
                f"tools.bench.input_apps:{app}",
            ]
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        return cls(process, log_path)

    def wait_ready(self, bootstrap: str, reader: latency.Reader, topic: str) -> None:
        """Until a probe record has come through every partition (the group joined, the tables read)."""
        probe = Producer({"bootstrap.servers": bootstrap})
        for p in range(PARTITIONS):
            probe.produce(topic, latency.STAMP.pack(0.0), partition=p)
        probe.flush(10)
        seen, deadline = 0, time.monotonic() + 120
        while seen < PARTITIONS:
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise BenchError(f"pipeline not ready (exit {self.process.poll()}):\n{tail}")
            seen += sum(1 for _ in reader.read(0.2))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def lookup_once(bootstrap: str, app: str, rate: int, seconds: float, log_dir: Path) -> tuple[float, float] | None:
    """(p50, p99) ms of the records produced after a 5 s warm-up."""
    names = [input_apps.A, input_apps.OUT, input_apps.TABLE, input_apps.GLOBAL]
    with fresh_topics(bootstrap, names) as suffix:
        if app == "table_lookup":
            fill_table(bootstrap, f"{input_apps.TABLE}{suffix}", input_apps.LOOKUP_KEYS, every_partition=True)
        if app == "global_lookup":
            fill_table(bootstrap, f"{input_apps.GLOBAL}{suffix}", input_apps.LOOKUP_KEYS, every_partition=False)
        reader = latency.Reader(bootstrap, f"{input_apps.OUT}{suffix}")
        served = Served.start(bootstrap, app, suffix, log_dir)
        try:
            served.wait_ready(bootstrap, reader, f"{input_apps.A}{suffix}")
            window_start = time.time() + 5
            producer, done = latency.start_producer(
                bootstrap, f"{input_apps.A}{suffix}", rate, 5 + seconds, window_start
            )
            produced, latencies = latency._measure(reader, producer, done, window_start)
        except (BenchError, RuntimeError) as e:
            log.error("%s: %s", app, e)
            return None
        finally:
            served.stop()
            reader.close()
    if len(latencies) < produced:
        log.error("%s: %d of %d records came out", app, len(latencies), produced)
        return None
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49], cuts[98]


def bench_lookup(bootstrap: str, rate: int, seconds: float, repeat: int, log_dir: Path) -> list[str]:
    apps = ("one", "table_lookup", "global_lookup")
    runs: dict[str, list[tuple[float, float]]] = {a: [] for a in apps}
    for round_ in range(repeat):
        for app in apps:
            result = lookup_once(bootstrap, app, rate, seconds, log_dir)
            log.info(
                "lookup round %d, %s: p50 / p99 %s ms", round_ + 1, app, result and f"{result[0]:.0f} / {result[1]:.0f}"
            )
            if result:
                runs[app].append(result)
    lines = [
        f"end-to-end latency at {rate:,} records/s, {seconds:.0f} s per run, exactly-once, 100 ms commits,"
        f" medians of {repeat}:"
    ]
    for app in apps:
        if runs[app]:
            p50 = statistics.median(r[0] for r in runs[app])
            p99 = statistics.median(r[1] for r in runs[app])
            lines.append(
                f"  {app:<14} p50 {p50:5.0f} ms   p99 {p99:5.0f} ms"
                f"   runs p99 {', '.join(f'{r[1]:.0f}' for r in runs[app])}"
            )
        else:
            lines.append(f"  {app:<14} no complete run (see the log)")
    return lines


# -- main --------------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.inputs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--only", default="throughput,global,lookup", help="comma-separated: throughput,global,lookup")
    parser.add_argument("--records", type=int, default=300_000, help="throughput: records in total")
    parser.add_argument("--keys", type=int, default=1_000_000, help="global: keys in the table")
    parser.add_argument("--rate", type=int, default=5_000, help="lookup: records/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="lookup: seconds measured per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/bench-inputs"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pipeline").setLevel(logging.WARNING)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    lines = [load_line("at the start")]
    if "throughput" in only:
        lines += bench_throughput(args.bootstrap, args.records, args.repeat)
    if "global" in only:
        lines += bench_global(args.bootstrap, args.keys, args.repeat)
    if "lookup" in only:
        lines += bench_lookup(args.bootstrap, args.rate, args.seconds, args.repeat, args.log_dir)
    lines.append(load_line("at the end"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
