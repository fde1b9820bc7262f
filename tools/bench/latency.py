"""`python -m tools.bench.latency`: end-to-end latency of the copier, from the input's produce to the output being
visible to a read_committed consumer, at a paced load.

Each cell (guarantee x commit interval x load) runs on fresh topics (3 partitions in, 3 out) with a real pipeline
process (`python -m pipeline run pipeline.examples.copier:app`). A producer process writes records paced at the
cell's rate, each value starting with its wall-clock produce time (8 bytes, then padding to 100 B); this process
reads the output with a read_committed consumer and takes `receive time - produce time` for every record produced
after the warm-up. Producer, pipeline and reader are three processes, so no GIL is shared between them.

The load is a fraction of the maximum throughput, measured first for each guarantee and commit interval in the same
set-up: the producer writes as fast as it can while the pipeline and the reader run, and the output rate is taken
between 10 % and 90 % of the records.

    python -m tools.bench.latency                                  # the whole matrix (about 20 minutes)
    python -m tools.bench.latency --only eos@100,alo@100 --loads 50 --seconds 20
    python -m tools.bench.latency --trees before=/tmp/before,after=.   # the same cells, code trees alternating
    python -m tools.bench.latency --max-rate eos@100=60000         # skip measuring the maximum of a cell
    python -m tools.bench.latency --only eos@100 --producers per_partition,per_process   # both PRODUCERS, alternating
    python -m tools.bench.latency --only eos@100 --variant off= --variant on=PIPELINE_FAILURE_DETECTION_MS=500

A code tree is a checkout whose `pipeline` package the pipeline process imports (PYTHONPATH): compare two commits
with `git worktree add /tmp/before <commit>`. Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.testing.inputs import create_topics

log = logging.getLogger("tools.bench.latency")

PARTITIONS = 3
VALUE_SIZE = 100
STAMP = struct.Struct(">d")  # wall-clock seconds at produce(), at the start of every value
GUARANTEES = {"eos": "exactly_once", "alo": "at_least_once"}
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 20.0
Variant = tuple[str, Mapping[str, str]]  # a name, and the environment it adds to the pipeline process
MAX_RECORDS = 600_000  # produced as fast as possible to measure the maximum throughput


@dataclass(frozen=True)
class Cell:
    guarantee: str  # "eos" | "alo"
    interval_ms: int
    load_percent: int

    @property
    def key(self) -> str:
        return f"{self.guarantee}@{self.interval_ms}"


@dataclass
class Result:
    tree: str
    cell: Cell
    rate: int
    produced: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and at the end
    error: str = ""
    metric: str = "-"  # the pipeline's own pipeline_end_to_end_latency_seconds{record="first"} in the window
    variant: str = ""  # the name of the settings the pipeline process ran with (--producers, --variant; "": none)

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def missing(self) -> int:
        return self.produced - len(self.latencies_ms)


# -- processes ---------------------------------------------------------------------------------------------------------
def produce_paced(
    bootstrap: str, topic: str, rate: float, seconds: float, window_start: float, done: multiprocessing.Queue
) -> None:
    """Runs in its own process: `rate` records/s for `seconds` (rate 0: `seconds` records, as fast as possible),
    round robin over the partitions, each value stamped with its produce time. Puts (records produced, of which
    stamped at or after `window_start`)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    pad = b"x" * (VALUE_SIZE - STAMP.size)
    total = int(rate * seconds) if rate else int(seconds)
    started, n, in_window = time.time(), 0, 0
    while n < total:
        due = total if not rate else min(total, int((time.time() - started) * rate) + 1)
        while n < due:
            stamp = time.time()
            try:
                producer.produce(topic, STAMP.pack(stamp) + pad, partition=n % PARTITIONS)
            except BufferError:
                producer.poll(0.01)
                continue
            n += 1
            in_window += stamp >= window_start
        producer.poll(0)
        if rate:
            time.sleep(max(0.0, n / rate - (time.time() - started)))
    producer.flush(60)
    done.put((n, in_window))


def start_producer(
    bootstrap: str, topic: str, rate: float, seconds: float, window_start: float = 0.0
) -> tuple[BaseProcess, multiprocessing.Queue]:
    context = multiprocessing.get_context("spawn")  # no fork of a process with librdkafka threads
    done = context.Queue()
    process = context.Process(
        target=produce_paced, args=(bootstrap, topic, rate, seconds, window_start, done), daemon=True
    )
    process.start()
    return process, done


@dataclass(frozen=True)
class Histogram:
    buckets: Mapping[float, float]  # upper bound (s) -> cumulative count
    total: float
    count: float

    def since(self, earlier: Histogram | None) -> str:
        """`mean / p99 ms` of what was observed after `earlier` (p99: the upper bound of its bucket)."""
        before = earlier or Histogram({}, 0.0, 0.0)
        count = self.count - before.count
        if count <= 0:
            return "-"
        cumulative = sorted((le, n - before.buckets.get(le, 0.0)) for le, n in self.buckets.items())
        p99 = next(le for le, n in cumulative if n >= 0.99 * count)
        return f"{1000 * (self.total - before.total) / count:.0f} / {1000 * p99:.0f}"


@dataclass
class Pipeline:
    """One `pipeline run` process of the copier, importing `pipeline` from a code tree."""

    process: subprocess.Popen
    log_path: Path
    metrics_port: int

    @classmethod
    def start(
        cls,
        tree: Path,
        bootstrap: str,
        app_id: str,
        topics: tuple[str, str],
        cell: Cell,
        extra_env: Mapping[str, str],
        log_dir: Path,
    ) -> Pipeline:
        env = {
            **os.environ,
            **extra_env,
            "PYTHONPATH": str(tree),
            "PIPELINE_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_APP_ID": app_id,
            "PIPELINE_INPUT_TOPIC": topics[0],
            "PIPELINE_OUTPUT_TOPIC": topics[1],
            "PIPELINE_PROCESSING_GUARANTEE": GUARANTEES[cell.guarantee],
            "PIPELINE_COMMIT_INTERVAL_MS": str(cell.interval_ms),
        }
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            env["PIPELINE_METRICS_PORT"] = str(port := probe.getsockname()[1])
        log_path = log_dir / f"{app_id}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "--log-level", "warning", "run", "pipeline.examples.copier:app"],
                cwd=tree,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return cls(process, log_path, port)

    def end_to_end_histogram(self) -> Histogram | None:
        """The pipeline's own pipeline_end_to_end_latency_seconds{record="first"} now: None when the code tree has
        no such metric."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        buckets: dict[float, float] = {}
        total = count = 0.0
        for line in text.splitlines():
            if not line.startswith("pipeline_end_to_end_latency_seconds_") or 'record="first"' not in line:
                continue
            value = float(line.rsplit(" ", 1)[1])
            if "_bucket{" in line and (le := re.search(r'le="([^"]+)"', line)) is not None:
                buckets[float(le.group(1))] = value
            elif "_sum{" in line:
                total = value
            elif "_count{" in line:
                count = value
        return Histogram(buckets, total, count) if buckets else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])


class Reader:
    """read_committed consumer of the output: (receive time, produce stamp) of every record, as it arrives."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"latency-reader-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )  # the reader's own wait must not be measured
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])

    def read(self, timeout_s: float) -> Iterator[tuple[float, float]]:
        """What arrived within `timeout_s`: the first record waited for, the rest taken without waiting."""
        first = self.consumer.poll(timeout_s)
        if first is None:
            return
        messages = [first, *self.consumer.consume(10_000, 0)]
        now = time.time()
        for m in messages:
            if m.error():
                raise KafkaException(m.error())
            yield now, STAMP.unpack_from(cast(bytes, m.value()))[0]  # every record of the bench carries its stamp

    def close(self) -> None:
        self.consumer.close()


# -- one run -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench:
    bootstrap: str
    log_dir: Path
    extra_env: Mapping[str, str]

    @contextlib.contextmanager
    def topics(self, tree_name: str, cell: Cell) -> Iterator[tuple[str, str, str]]:
        app_id = f"latency-{tree_name}-{cell.guarantee}-{cell.interval_ms}-{uuid.uuid4().hex[:6]}"
        topics = (f"{app_id}-in", f"{app_id}-out")
        create_topics(self.bootstrap, dict.fromkeys(topics, PARTITIONS))
        try:
            yield app_id, *topics
        finally:
            cleanup(self.bootstrap, app_id)

    def max_rate(self, tree: Path, tree_name: str, cell: Cell, records: int = MAX_RECORDS) -> float:
        """Records/s out of the pipeline while the producer writes `records` as fast as it can, between 10 % and 90 %
        of them: the most this machine carries with producer, pipeline and reader all running (a backlog written
        beforehand gives a higher figure that the paced runs could not reach on the same cores)."""
        with self.topics(tree_name, cell) as (app_id, in_topic, out_topic):
            reader = Reader(self.bootstrap, out_topic)
            pipeline = Pipeline.start(
                tree, self.bootstrap, app_id, (in_topic, out_topic), cell, self.extra_env, self.log_dir
            )
            try:
                self._wait_ready(pipeline, reader, in_topic)
                producer, _ = start_producer(self.bootstrap, in_topic, 0, records)
                seen, marks, deadline = 0, {}, time.monotonic() + READY_TIMEOUT_S + records / 5_000
                while seen < records and time.monotonic() < deadline:
                    seen += sum(1 for _ in reader.read(0.5))
                    for fraction in (0.1, 0.9):
                        if seen >= fraction * records and fraction not in marks:
                            marks[fraction] = (time.monotonic(), seen)
                producer.join(10)
                if len(marks) < 2:
                    raise RuntimeError(f"max rate: only {seen}/{records} outputs\n{pipeline.tail()}")
                (t0, n0), (t1, n1) = marks[0.1], marks[0.9]
                return (n1 - n0) / max(t1 - t0, 1e-3)
            finally:
                pipeline.stop()
                reader.close()

    def latency(
        self,
        tree: Path,
        tree_name: str,
        cell: Cell,
        rate: int,
        seconds: float,
        warmup_s: float,
        variant: Variant = ("", {}),
    ) -> Result:
        result = Result(tree_name, cell, rate, load=(os.getloadavg()[0], 0.0), variant=variant[0])
        env = {**self.extra_env, **variant[1]}
        with self.topics(tree_name, cell) as (app_id, in_topic, out_topic):
            reader = Reader(self.bootstrap, out_topic)
            pipeline = Pipeline.start(tree, self.bootstrap, app_id, (in_topic, out_topic), cell, env, self.log_dir)
            try:
                self._wait_ready(pipeline, reader, in_topic)
                window_start = time.time() + warmup_s  # the producer's start-up counts as warm-up
                producer, done = start_producer(self.bootstrap, in_topic, rate, warmup_s + seconds, window_start)
                at_start = _after(window_start, pipeline.end_to_end_histogram)
                result.produced, result.latencies_ms = _measure(reader, producer, done, window_start)
                at_end = pipeline.end_to_end_histogram()
                result.metric = at_end.since(at_start()) if at_end else "-"
            except RuntimeError as e:
                result.error = str(e)
            finally:
                pipeline.stop()
                reader.close()
        result.load = (result.load[0], os.getloadavg()[0])
        return result

    def floor(self, cell: Cell, rate: int, seconds: float, warmup_s: float) -> Result:
        """The same producer and reader without a pipeline in between (the reader on the input topic): what the
        machine, the broker and the measurement add by themselves."""
        result = Result("floor", cell, rate, load=(os.getloadavg()[0], 0.0))
        with self.topics("floor", cell) as (_, in_topic, _out):
            reader = Reader(self.bootstrap, in_topic)
            try:
                window_start = time.time() + warmup_s
                producer, done = start_producer(self.bootstrap, in_topic, rate, warmup_s + seconds, window_start)
                result.produced, result.latencies_ms = _measure(reader, producer, done, window_start)
            except RuntimeError as e:
                result.error = str(e)
            finally:
                reader.close()
        result.load = (result.load[0], os.getloadavg()[0])
        return result

    def _wait_ready(self, pipeline: Pipeline, reader: Reader, in_topic: str) -> None:
        """Until a probe record has come through every partition: the group is joined and every partition fenced."""
        probe = Producer({"bootstrap.servers": self.bootstrap})
        for p in range(PARTITIONS):
            probe.produce(in_topic, STAMP.pack(0.0), partition=p)
        probe.flush(10)
        seen, deadline = 0, time.monotonic() + READY_TIMEOUT_S
        while seen < PARTITIONS:
            if pipeline.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pipeline not ready (exit {pipeline.process.poll()}):\n{pipeline.tail()}")
            seen += sum(1 for _ in reader.read(0.2))


def _after(moment: float, probe: Callable[[], Histogram | None]) -> Callable[[], Histogram | None]:
    """probe() taken once `moment` (wall clock) has passed, on a thread: the reader must not stop meanwhile."""
    taken: list[Histogram | None] = []

    def take() -> None:
        time.sleep(max(0.0, moment - time.time()))
        taken.append(probe())

    thread = threading.Thread(target=take, daemon=True)
    thread.start()

    def result() -> Histogram | None:
        thread.join()
        return taken[0] if taken else None

    return result


def _measure(
    reader: Reader, producer: BaseProcess, done: multiprocessing.Queue, window_start: float
) -> tuple[int, list[float]]:
    """Reads until every produced record came out (or DRAIN_TIMEOUT_S after the producer finished); returns the
    number of records produced in the window and the latencies (ms) of those that came out."""
    latencies: list[float] = []
    seen, total, in_window, deadline = 0, None, 0, float("inf")
    while (total is None or seen < total) and time.monotonic() < deadline:
        for received, stamp in reader.read(0.1):
            seen += 1
            if stamp >= window_start:
                latencies.append(1000 * (received - stamp))
        if total is None and not done.empty():
            total, in_window = done.get()
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
        elif total is None and not producer.is_alive() and done.empty():
            raise RuntimeError("the producer process died")
    producer.join(10)
    return in_window, latencies


def cleanup(bootstrap: str, app_id: str, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        names = [t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith(app_id)]
        futures = [*admin.delete_topics(names, operation_timeout=timeout_s).values()] if names else []
        futures += admin.delete_consumer_groups([app_id], request_timeout=timeout_s).values()
        for future in futures:
            with contextlib.suppress(KafkaException):
                future.result(timeout=timeout_s)
    except KafkaException as e:
        log.warning("%s: cleanup failed: %s", app_id, e)


# -- the matrix --------------------------------------------------------------------------------------------------------
def cells(only: str, intervals: Sequence[int], loads: Sequence[int]) -> list[Cell]:
    """Every guarantee x interval x load; `only` (e.g. "eos@100,alo@100") keeps the named guarantee@interval."""
    keep = {token.strip() for token in only.split(",") if token.strip()}
    matrix = [Cell(g, i, load) for load in loads for g in GUARANTEES for i in intervals]
    return [c for c in matrix if not keep or c.key in keep]


def parse_trees(spec: str) -> dict[str, Path]:
    trees = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, path = item.rpartition("=")
        trees[name or Path(path).resolve().name] = Path(path).resolve()
    return trees


def parse_variants(producers: str, specs: Sequence[str]) -> list[Variant]:
    """--producers a,b and --variant NAME=SETTING=VALUE[;SETTING=VALUE] as (name, environment) pairs; none: one
    variant with nothing changed."""
    variants: list[Variant] = [(p, {"PIPELINE_PRODUCERS": p}) for p in map(str.strip, producers.split(",")) if p]
    for spec in specs:
        name, _, settings = spec.partition("=")
        variants.append((name, dict(item.split("=", 1) for item in settings.split(";") if item)))
    return variants or [("", {})]


def parse_rates(spec: Sequence[str]) -> dict[str, float]:
    rates = {}
    for item in spec:
        key, _, value = item.partition("=")
        rates[key] = float(value)
    return rates


def run(
    bench: Bench,
    trees: Mapping[str, Path],
    chosen: Sequence[Cell],
    max_rates: dict[str, float],
    seconds: float,
    warmup_s: float,
    repeat: int,
    floor: bool,
    variants: Sequence[Variant] = (("", {}),),
) -> list[Result]:
    """The maximum of a cell is measured with the last tree and the pipeline's default PRODUCERS; every tree and
    PRODUCERS value then runs at the same rate."""
    results = []
    max_tree = list(trees)[-1]
    for cell in chosen:
        if cell.key not in max_rates:
            max_rates[cell.key] = bench.max_rate(trees[max_tree], max_tree, cell)
            print(
                f"max {cell.key} ({max_tree}): {max_rates[cell.key]:,.0f} rec/s, load {os.getloadavg()[0]:.1f}",
                file=sys.stderr,
                flush=True,
            )
        rate = int(max_rates[cell.key] * cell.load_percent / 100)
        for _ in range(repeat):
            for name, tree in trees.items():  # alternating, so that a burst of load elsewhere hits every tree alike
                for variant in variants:
                    result = bench.latency(tree, name, cell, rate, seconds, warmup_s, variant)
                    print(row(result), file=sys.stderr, flush=True)
                    results.append(result)
            if floor:
                results.append(bench.floor(cell, rate, seconds, warmup_s))
                print(row(results[-1]), file=sys.stderr, flush=True)
    return results


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def row(r: Result) -> str:
    c = r.cell
    code = f"{r.tree} ({r.variant})" if r.variant else r.tree
    return (
        f"| {code} | {GUARANTEES[c.guarantee]} | {c.interval_ms} ms | {c.load_percent} % ({r.rate:,}/s) "
        f"| {len(r.latencies_ms):,} | {_ms(r.percentile(0.5))} | {_ms(r.percentile(0.99))} "
        f"| {_ms(r.percentile(0.999))} | {_ms(max(r.latencies_ms, default=None))} | {r.missing:,} "
        f"| {r.metric} | {r.load[0]:.1f} / {r.load[1]:.1f} |" + (f" {r.error.splitlines()[0]}" if r.error else "")
    )


def table(results: Sequence[Result], max_rates: Mapping[str, float]) -> str:
    lines = [
        "| code | guarantee | commit interval | load (rate) | records | p50 ms | p99 ms | p99.9 ms | max ms "
        "| not seen | metric mean / p99 ms | load avg start / end |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    lines += [row(r) for r in results]
    lines += [
        "",
        "Maximum throughput (records/s, backlog): " + ", ".join(f"{k} {v:,.0f}" for k, v in max_rates.items()),
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.latency", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--only", default="", help="guarantee@interval cells, e.g. eos@100,alo@100 (default all)")
    parser.add_argument("--intervals", default="20,100,1000", help="commit intervals in ms (default 20,100,1000)")
    parser.add_argument("--loads", default="10,50,90", help="percent of the maximum throughput (default 10,50,90)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run (default 20)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring (default 3)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell and tree")
    parser.add_argument(
        "--trees",
        default=".",
        help="name=path,... code trees to compare, alternating per cell "
        "(default: this checkout); the maximum throughput is measured with the last one",
    )
    parser.add_argument(
        "--max-rate",
        action="append",
        default=[],
        metavar="CELL=RATE",
        help="maximum throughput of a cell, e.g. eos@100=60000 (skips measuring it)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the pipeline process, e.g. PIPELINE_GROUP_PROTOCOL=consumer",
    )
    parser.add_argument(
        "--producers",
        default="",
        help="PRODUCERS values of the pipeline, comma-separated, "
        "alternating per cell like the trees, e.g. per_partition,per_process (default: its default)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=SETTING=VALUE[;SETTING=VALUE]",
        help="settings of the pipeline to compare, alternating per cell like the trees (repeatable; NAME= alone: "
        "nothing changed), e.g. --variant off= --variant standby=PIPELINE_STANDBY_REPLICAS=1",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="after each cell, the producer and reader alone (no "
        "pipeline) at the same rate: the machine's and the measurement's share",
    )
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the pipeline process and delete topics on the way
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chosen = cells(args.only, [int(i) for i in args.intervals.split(",")], [int(x) for x in args.loads.split(",")])
    extra_env = dict(item.split("=", 1) for item in args.env)
    max_rates = parse_rates(args.max_rate)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="latency-") as log_dir:
        bench = Bench(args.bootstrap_servers, Path(log_dir), extra_env)
        variants = parse_variants(args.producers, args.variant)
        results = run(
            bench,
            parse_trees(args.trees),
            chosen,
            max_rates,
            args.seconds,
            args.warmup,
            max(1, args.repeat),
            args.floor,
            variants,
        )
    print(table(results, max_rates))
    print(f"\n(bench took {time.monotonic() - started:.0f}s)", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
