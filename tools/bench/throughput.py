"""`python -m tools.bench`: throughput of the KafkaRunner against a plain consume->produce loop, on a real broker.

Every cell of the matrix (workload x value size x commit interval) runs three modes, each on fresh topics pre-filled
with the same records (3 input partitions):
    raw  a plain, non-transactional confluent-kafka loop: consume a batch, produce every record with the same key and
         value to the same output partition, commit offsets asynchronously every commit interval. No framework: the
         physical limit of one Python process. Its producer is configured like the KafkaRunner's at_least_once producer
         (idempotent, acks=all, linger.ms=5), so raw vs at_least_once is the cost of the framework alone.
    hand the same work as the App written by hand (tools/bench/hand.py): consume a batch, decode, update a dict,
         encode, produce, commit offsets asynchronously every commit interval; no transactions, no provenance header.
         What a user would write instead of the template: every cell reports eos / hand (issue 33).
    alo  the KafkaRunner with processing_guarantee=at_least_once
    eos  the KafkaRunner with exactly_once (the default)
alo and eos run with the template's default PRODUCERS (per_process: what a user who sets nothing runs); with
`--producers per_process,per_partition` each also runs as alo-per_partition / eos-per_partition, interleaved.

Throughput is measured from the first input record processed to the last one (records_in reaching N; raw and hand:
their producer flushed), so group join, fencing and restore are excluded; commits during the run are included, the
final one is not. After every run an observer counts the committed outputs (read_committed, the whole output topic):
anything but one per input record (both workloads map one record to one output) fails the run. Rates count only
the records processed after the first sample that saw progress. Everything runs in-process, the loops in threads.
A profile pass runs the exactly_once copier (100 B, 100 ms) under cProfile, from the first record processed to the
last one, and prints the top functions by cumulative and by own time.

    python -m tools.bench                      # whole matrix + profile (~4 min on 2 cores)
    python -m tools.bench --quick              # fewer records: a smoke run
    python -m tools.bench --only copier,100ms,eos,raw --records 50000
    python -m tools.bench --only copier,100ms --producers per_process,per_partition   # both PRODUCERS, interleaved
    python -m tools.bench --overhead           # CPU per record without a broker, ours and by hand (stable)
    python -m tools.bench --phases --only running_totals,100B,100ms,hand,eos   # each loop thread's CPU per record
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import logging
import os
import pstats
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pipeline import settings as settings_module
from pipeline.app import App, Output, Record, State
from pipeline.examples import copier, running_totals
from pipeline.kafka.clients import produce_waiting
from pipeline.kafka.offsets import TailReader, high_watermarks, read_to_end
from pipeline.metrics import Metrics
from pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, PER_PARTITION, PER_PROCESS
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing.inputs import create_topics, produce_copier, produce_running_totals
from tools.bench import hand, overhead
from tools.bench.phases import Phases

log = logging.getLogger("tools.bench.throughput")

PARTITIONS = 3
WORKLOADS: dict[str, App] = {"copier": copier.app, "running_totals": running_totals.app}
SIZES: dict[str, int] = {"100B": 100, "1KB": 1024}
INTERVALS: dict[str, int] = {"100ms": 100, "1s": 1000}
MODES: dict[str, str | None] = {"raw": None, "hand": None, "alo": AT_LEAST_ONCE, "eos": EXACTLY_ONCE}
LOOP_MODES = ("raw", "hand")  # no KafkaRunner: run once per cell whatever PRODUCERS
PRODUCERS = (PER_PROCESS, PER_PARTITION)
# The mode names without a suffix run the template's default PRODUCERS, so that the table's eos column is what a user
# who sets nothing gets; "eos-per_partition" is the KafkaRunner mode with the other value.
DEFAULT_PRODUCERS = settings_module.Settings.producers
OTHER_PRODUCERS = PER_PARTITION if DEFAULT_PRODUCERS == PER_PROCESS else PER_PROCESS
OTHER_SUFFIX = f"-{OTHER_PRODUCERS}"
PHASES: Phases | None = None  # --phases: the steps of every loop timed (tools/bench/phases.py)
DEFAULT_RECORDS: dict[int, int] = {100: 400_000, 1024: 150_000}
QUICK_RECORDS: dict[int, int] = {100: 20_000, 1024: 8_000}
PROFILE_RECORDS = 100_000
BATCH = 5_000  # records per consume() call, as the KafkaRunner's default poll_max_records
SAMPLE_S = 0.005
STOP_TIMEOUT_S = 30.0
TARGET_EOS_ALO = 0.85
TARGET_EOS_RAW = 0.5
TARGET_EOS_HAND = 0.9  # issue 33: exactly-once at >= 0.9x the same work by hand without it


class BenchError(RuntimeError):
    """A run did not finish (timeout, or the worker thread died)."""


@dataclass(frozen=True)
class Cell:
    workload: str
    size: str
    interval: str
    records: int

    @property
    def value_size(self) -> int:
        return SIZES[self.size]

    @property
    def commit_interval_ms(self) -> int:
        return INTERVALS[self.interval]

    def label(self) -> str:
        return f"{self.workload}/{self.size}/{self.interval}"


@dataclass(frozen=True)
class Result:
    rate: float | None  # input records per second; None if the run failed
    seconds: float = 0.0
    error: str = ""
    transactions: int = 0  # KafkaRunner modes: commits (all partitions) until the last input record was processed
    commit_s: float = 0.0  # their summed latency (commits of several partitions run in parallel)
    runs: tuple[float | None, ...] = ()  # with --repeat: the rate of every run; this result is their median

    def with_commits(self, metrics: Metrics) -> Result:
        samples = {s.name: s.value for m in metrics.commit_latency.collect() for s in m.samples}
        count = int(samples.get("pipeline_commit_latency_seconds_count", 0))
        return replace(self, transactions=count, commit_s=samples.get("pipeline_commit_latency_seconds_sum", 0.0))


@dataclass(frozen=True)
class Run:
    """One mode of one cell: its own topics and consumer group, all named after run_id."""

    cell: Cell
    mode: str
    bootstrap: str
    run_id: str
    counts: Mapping[int, int]  # input records per partition

    @property
    def input_topic(self) -> str:
        return f"{self.run_id}-in"

    @property
    def output_topic(self) -> str:
        return f"{self.run_id}-out"


# -- topics ------------------------------------------------------------------------------------------------------------
def prepare(cell: Cell, mode: str, bootstrap: str) -> Run:
    run_id = f"bench-{cell.workload.replace('_', '-')}-{cell.size}-{cell.interval}-{mode}-{uuid.uuid4().hex[:6]}"
    run = Run(cell, mode, bootstrap, run_id, {})
    create_topics(bootstrap, {run.input_topic: PARTITIONS, run.output_topic: PARTITIONS})
    return replace(run, counts=fill(run))


def fill(run: Run) -> dict[int, int]:
    cell = run.cell
    if cell.workload == "copier":
        return produce_copier(
            run.bootstrap, run.input_topic, cell.records, partitions=PARTITIONS, value_size=cell.value_size
        )
    return produce_running_totals(
        run.bootstrap, run.input_topic, cell.records, partitions=PARTITIONS, value_size=cell.value_size
    )


def cleanup(run: Run, timeout_s: float = 30.0) -> None:
    """Deletes every topic and group named after the run (the KafkaRunner adds its internal topics)."""
    admin = AdminClient({"bootstrap.servers": run.bootstrap})
    try:
        names = [t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith(run.run_id)]
        futures = [*admin.delete_topics(names, operation_timeout=timeout_s).values()] if names else []
        futures += admin.delete_consumer_groups([run.run_id], request_timeout=timeout_s).values()
        for future in futures:
            with contextlib.suppress(KafkaException):
                future.result(timeout=timeout_s)
    except KafkaException as e:
        log.warning("%s: cleanup failed: %s", run.run_id, e)


# -- measuring ---------------------------------------------------------------------------------------------------------
class Worker:
    """A daemon thread that remembers how its target ended."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._target()
        except BaseException as e:  # reported by the measuring thread
            self.error = e

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("%s still running %.0fs after stop", self._thread.name, timeout_s)


class Liveness(Protocol):
    """What measure() watches while it samples: a Worker thread, or a process (tools/bench/partitions.py)."""

    @property
    def error(self) -> BaseException | str | None: ...  # read-only: a Worker keeps an exception, a process a text

    def alive(self) -> bool: ...


def measure(
    progress: Callable[[], int], total: int, worker: Liveness, timeout_s: float, sample_s: float = SAMPLE_S
) -> Result:
    """Samples progress every sample_s until it reaches total; the rate counts only what was processed after the first
    sample > 0."""
    deadline = time.monotonic() + timeout_s
    first: tuple[float, int] | None = None
    while True:
        count, now = progress(), time.monotonic()
        if first is None and count > 0:
            first = (now, count)
        if count >= total:
            break
        if not worker.alive():
            raise BenchError(f"worker stopped at {count}/{total}: {worker.error!r}")
        if now > deadline:
            raise BenchError(f"timeout after {timeout_s:.0f}s at {count}/{total}")
        time.sleep(sample_s)
    assert first is not None
    elapsed = now - first[0]
    if elapsed <= 0:
        return Result(None, 0.0, "all records arrived in one batch: use more --records")
    return Result((total - first[1]) / elapsed, elapsed)


def records_in(metrics: Metrics) -> int:
    samples = (s for m in metrics.records_in.collect() for s in m.samples if s.name.endswith("_total"))
    return int(sum(s.value for s in samples))


# -- modes raw and hand ------------------------------------------------------------------------------------------------
class RawLoop:
    """consume -> `work` on the batch (raw: produce the same key/value to the same partition; hand: the App's work by
    hand, tools/bench/hand.py) -> async offset commit every interval.

    `done` counts the records processed, but reaches N only once the producer has flushed the last outputs: the
    KafkaRunner modes flush (alo) or commit (eos) every interval, so raw must not win by leaving its outputs queued.
    """

    def __init__(self, run: Run, work: hand.HandBatch | None = None) -> None:
        self.run_ = run
        self.count = 0
        self.done = 0
        self._stop = threading.Event()
        self._work = work or _copy_batch
        if PHASES is not None:
            self._work = PHASES.timed("process", self._work)
            self._loop = PHASES.timed("turn", self._loop)  # type: ignore[method-assign]

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        r = self.run_
        consumer = Consumer(
            {
                "bootstrap.servers": r.bootstrap,
                "group.id": r.run_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        config = hand.producer_config(r.bootstrap)
        if self._work is _copy_batch:  # raw as it always was: the default partitioner (every record names its own)
            del config["partitioner"]
        producer = Producer(config)
        consumer.subscribe([r.input_topic])
        try:
            self._loop(consumer, producer, r.cell.commit_interval_ms / 1000)
        finally:
            producer.flush(10)
            consumer.close()

    def _loop(self, consumer: Consumer, producer: Producer, interval_s: float) -> None:
        topic, work = self.run_.output_topic, self._work
        next_commit, dirty = time.monotonic() + interval_s, False
        while not self._stop.is_set():
            batch = consumer.consume(BATCH, 0.1)
            work(batch, producer, topic)
            self.count += len(batch)
            self._update_done(producer)
            dirty = dirty or bool(batch)
            if dirty and time.monotonic() >= next_commit:
                consumer.commit(asynchronous=True)
                next_commit, dirty = time.monotonic() + interval_s, False

    def _update_done(self, producer: Producer) -> None:
        total = self.run_.cell.records
        if self.count >= total > self.done:
            producer.flush(STOP_TIMEOUT_S)
        self.done = self.count if self.count >= total else min(self.count, total - 1)


def _copy_batch(batch: Sequence[Any], producer: Producer, topic: str) -> None:
    """raw: every record's key and value to the same partition number."""
    for m in batch:
        if m.error():
            raise KafkaException(m.error())
        produce_waiting(producer, topic, m.value(), m.key(), partition=m.partition())  # a record's partition
    producer.poll(0)


def run_raw(run: Run, timeout_s: float, work: hand.HandBatch | None = None) -> Result:
    loop = RawLoop(run, work)
    worker = Worker(loop.run, f"{'hand' if work else 'raw'}-{run.run_id}")
    try:
        return measure(lambda: loop.done, run.cell.records, worker, timeout_s)
    finally:
        loop.stop()
        worker.join(STOP_TIMEOUT_S)


def run_hand(run: Run, timeout_s: float) -> Result:
    return run_raw(run, timeout_s, hand.WORKLOADS[run.cell.workload]())


def count_committed(bootstrap: str, topic: str, timeout_s: float) -> int:
    """Records a read_committed reader sees in the whole topic: the observer of every run."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = list(admin.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
    ends = high_watermarks(admin, topic, partitions, timeout_s)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}.count",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        return sum(1 for _ in read_to_end(TailReader(consumer, topic, dict.fromkeys(ends, 0), ends), timeout_s))
    finally:
        consumer.close()


def checked_outputs(run: Run, result: Result, timeout_s: float) -> Result:
    """The result, failed if the committed outputs are not one per input record."""
    if result.rate is None:
        return result
    outputs = count_committed(run.bootstrap, run.output_topic, timeout_s)
    if outputs != run.cell.records:
        return replace(result, rate=None, error=f"{outputs} committed outputs for {run.cell.records} inputs")
    return result


# -- modes alo / eos ---------------------------------------------------------------------------------------------------
def make_runner(run: Run, app: App | None = None, **overrides: Any) -> KafkaRunner:
    """The runner of one run; `overrides` are further settings (state_store="disk", say)."""
    settings = settings_module.load(
        env={},
        bootstrap_servers=run.bootstrap,
        app_id=run.run_id,
        input_topic=run.input_topic,
        output_topic=run.output_topic,
        processing_guarantee=MODES[base_mode(run.mode)],
        commit_interval_ms=run.cell.commit_interval_ms,
        producers=OTHER_PRODUCERS if run.mode.endswith(OTHER_SUFFIX) else DEFAULT_PRODUCERS,
        **overrides,
    )
    return KafkaRunner(app or WORKLOADS[run.cell.workload], settings)


def run_runner(run: Run, timeout_s: float, app: App | None = None, **overrides: Any) -> Result:
    runner = make_runner(run, app, **overrides)
    worker = Worker(runner.run, f"runner-{run.run_id}")
    try:
        result = measure(lambda: records_in(runner.metrics), run.cell.records, worker, timeout_s)
        return result.with_commits(runner.metrics)
    finally:
        runner.stop()
        worker.join(STOP_TIMEOUT_S)


def base_mode(mode: str) -> str:
    """ "eos-per_partition" -> "eos": the guarantee of a mode whatever its PRODUCERS."""
    return mode.removesuffix(OTHER_SUFFIX)


def mode_variants(modes: Sequence[str], producers: Sequence[str]) -> list[str]:
    """raw and hand once; alo and eos once per PRODUCERS value, interleaved (raw, hand, alo, eos, alo-per_partition,
    ...)."""
    runner_modes = [m for m in modes if m not in LOOP_MODES]
    variants = [m for m in LOOP_MODES if m in modes]
    for p in producers:
        variants += [m if p == DEFAULT_PRODUCERS else m + OTHER_SUFFIX for m in runner_modes]
    return variants


def run_mode(cell: Cell, mode: str, bootstrap: str, timeout_s: float) -> Result:
    run = prepare(cell, mode, bootstrap)
    try:
        runs = {"raw": run_raw, "hand": run_hand}
        return checked_outputs(run, runs.get(mode, run_runner)(run, timeout_s), timeout_s)
    except BenchError as e:
        return Result(None, error=str(e))
    finally:
        cleanup(run)


# -- profile -----------------------------------------------------------------------------------------------------------
class ProfiledProcess:
    """Wraps an App's process: profiles its thread from the first record to the last input record."""

    def __init__(
        self,
        process: Callable[[State, Record], Iterable[Output]],
        profiler: cProfile.Profile,
        counts: Mapping[int, int],
    ) -> None:
        self._process = process
        self._profiler = profiler
        self._last = {p: n - 1 for p, n in counts.items() if n > 0}
        self.started = self.ended = 0.0

    def __call__(self, state: State, record: Record) -> Iterable[Output]:
        if not self.started:
            self.started = time.monotonic()
            self._profiler.enable()
        outputs = self._process(state, record)
        if self._last.get(record.partition) == record.offset:
            del self._last[record.partition]
            if not self._last:
                self._profiler.disable()
                self.ended = time.monotonic()
        return outputs


def profile(bootstrap: str, records: int, timeout_s: float, top: int) -> str:
    cell = Cell("copier", "100B", "100ms", records)
    run = prepare(cell, "eos", bootstrap)
    profiler = cProfile.Profile()
    wrapped = ProfiledProcess(copier.app.process, profiler, run.counts)
    try:
        result = run_runner(run, timeout_s, replace(copier.app, process=wrapped))
    finally:
        cleanup(run)
    stats = pstats.Stats(profiler)
    seconds = wrapped.ended - wrapped.started
    lines = [
        f"### Profile: exactly_once copier, 100 B, 100 ms, {records} records under cProfile",
        f"{seconds:.2f}s profiled, {records / seconds:,.0f} rec/s under the profiler "
        f"({_rate(result.rate)} rec/s by the sampler)",
        "",
        *key_entries(stats, seconds),
        "",
        f"Top {top} by cumulative time (the profiled thread only; commits of several partitions run in a pool):",
        "",
        *stats_table(stats, "cumulative", top, seconds),
        "",
        f"Top {top} by own time:",
        "",
        *stats_table(stats, "tottime", top, seconds),
    ]
    return "\n".join(lines)


KEY_FUNCTIONS = (  # (file suffix, function): where the profiled thread waits or works per batch
    ("pipeline/sinks/kafka/runner.py", "_commit_due"),
    ("pipeline/sinks/kafka/task.py", "commit"),
    ("~", "<method 'consume' of 'cimpl.Consumer' objects>"),
    ("pipeline/sinks/kafka/runner.py", "_dispatch"),
)


# pstats.Stats.stats (the profile's table) and .fcn_list (its keys, sorted) are what print_stats reads; typeshed does
# not declare them, hence the `type: ignore[attr-defined]` where they are read.
def key_entries(stats: pstats.Stats, seconds: float) -> list[str]:
    lines = []
    for suffix, name in KEY_FUNCTIONS:
        calls, cum = 0, 0.0
        for (path, _, func), (_, n, _, c, _) in stats.stats.items():  # type: ignore[attr-defined]
            if func == name and path.endswith(suffix):
                calls, cum = calls + n, cum + c
        lines.append(
            f"- `{name}`: {calls} calls, {cum:.3f}s cumulative ({100 * cum / seconds:.0f}% of the profiled time)"
        )
    return lines


def stats_table(stats: pstats.Stats, key: str, top: int, seconds: float) -> list[str]:
    stats.sort_stats(key)
    rows = ["| function | calls | own s | cum s | cum % |", "|---|---:|---:|---:|---:|"]
    for func in stats.fcn_list[:top]:  # type: ignore[attr-defined]
        _, calls, own, cum, _ = stats.stats[func]  # type: ignore[attr-defined]
        rows.append(f"| `{_func_name(func)}` | {calls} | {own:.3f} | {cum:.3f} | {100 * cum / seconds:.0f} |")
    return rows


def _func_name(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name
    short = path.split("site-packages/")[-1].split("/work/main/")[-1]
    return f"{short}:{line}({name})"


# -- report ------------------------------------------------------------------------------------------------------------
def _rate(rate: float | None) -> str:
    return "failed" if rate is None else f"{rate:,.0f}"


def _ratio(a: Result, b: Result) -> float | None:
    return a.rate / b.rate if a.rate and b.rate else None


def table(results: Mapping[Cell, Mapping[str, Result]]) -> str:
    header = (
        "| workload | value size | commit interval | raw rec/s | hand rec/s | at_least_once rec/s | exactly_once rec/s "
        "| eos/alo | eos/raw | eos/hand |"
    )
    rows = [header, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    not_run = Result(None)
    for cell, by_mode in results.items():
        raw, by_hand, alo, eos = (by_mode.get(m, not_run) for m in MODES)
        rates = [_rate(by_mode[m].rate) if m in by_mode else "-" for m in MODES]
        ratios = ["-" if r is None else f"{r:.2f}" for r in (_ratio(eos, alo), _ratio(eos, raw), _ratio(eos, by_hand))]
        rows.append(f"| {cell.workload} | {cell.size} | {cell.interval} | " + " | ".join([*rates, *ratios]) + " |")
    return "\n".join(
        [*rows, "", *target_lines(results), *producers_lines(results), *error_lines(results), "", *details(results)]
    )


def producers_lines(results: Mapping[Cell, Mapping[str, Result]]) -> list[str]:
    """The other PRODUCERS value against the default, measured in the same run (modes interleaved)."""
    lines = []
    for cell, by_mode in results.items():
        for guarantee in ("alo", "eos"):
            other_mode = by_mode.get(guarantee + OTHER_SUFFIX)
            if other_mode is None:
                continue
            ratios = [
                f"{name} {r:.2f}"
                for name, base in (
                    (f"/ {DEFAULT_PRODUCERS}", guarantee),
                    ("/ raw", "raw"),
                    ("/ hand", "hand"),
                    (f"/ alo {OTHER_PRODUCERS}", "alo" + OTHER_SUFFIX),
                )
                if base != guarantee + OTHER_SUFFIX
                and base in by_mode
                and (r := _ratio(other_mode, by_mode[base])) is not None
            ]
            lines.append(
                f"- {cell.label()} {guarantee} {OTHER_PRODUCERS}: {_rate(other_mode.rate)} rec/s; " + ", ".join(ratios)
            )
    return lines


def details(results: Mapping[Cell, Mapping[str, Result]]) -> list[str]:
    rows = [
        "| cell | mode | records | measured s | transactions | mean commit ms | every run rec/s |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for cell, by_mode in results.items():
        for mode, r in by_mode.items():
            mean = f"{1000 * r.commit_s / r.transactions:.1f}" if r.transactions else "-"
            runs = " / ".join(_rate(rate) for rate in r.runs)
            rows.append(
                f"| {cell.label()} | {mode} | {cell.records} | {r.seconds:.2f} | {r.transactions or '-'} "
                f"| {mean} | {runs} |"
            )
    return rows


def target_lines(results: Mapping[Cell, Mapping[str, Result]]) -> list[str]:
    lines = []
    for cell, by_mode in results.items():
        if cell.interval != "100ms" or "eos" not in by_mode:
            continue
        targets = (("alo", TARGET_EOS_ALO), ("raw", TARGET_EOS_RAW), ("hand", TARGET_EOS_HAND))
        verdict = [
            _verdict(f"eos/{mode}", _ratio(by_mode["eos"], by_mode[mode]), target)
            for mode, target in targets
            if mode in by_mode
        ]
        if verdict:
            lines.append(f"- target at 100 ms, {cell.label()}: " + ", ".join(verdict))
    return lines


def _verdict(name: str, value: float | None, target: float) -> str:
    if value is None:
        return f"{name} unknown"
    return f"{name} {value:.2f} {'met' if value >= target else 'MISSED'} (>= {target})"


def error_lines(results: Mapping[Cell, Mapping[str, Result]]) -> list[str]:
    return [
        f"- {cell.label()} {mode}: {r.error}"
        for cell, by_mode in results.items()
        for mode, r in by_mode.items()
        if r.error
    ]


# -- command line ------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument(
        "--records",
        type=int,
        help="records per cell and for the profile (default: 400k for 100 B, 150k for 1 KB, 100k for the profile)",
    )
    parser.add_argument("--quick", action="store_true", help="20k / 8k records per cell: a smoke run")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated filters, AND across dimensions, OR within one: "
        f"{', '.join([*WORKLOADS, *SIZES, *INTERVALS, *MODES])}, e.g. copier,100ms,raw,eos",
    )
    parser.add_argument(
        "--producers",
        default=DEFAULT_PRODUCERS,
        help="PRODUCERS of the alo/eos modes, comma-separated "
        f"({', '.join(PRODUCERS)}); with both, every KafkaRunner mode runs once per value, interleaved",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode and cell; the median is reported")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for one run (default 120)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profile pass")
    parser.add_argument("--profile-only", action="store_true", help="only the profile pass")
    parser.add_argument("--top", type=int, default=15, help="functions listed by the profile (default 15)")
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="only the framework's cost per record, without a broker (tools/bench/overhead.py)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="print each run's loop-thread CPU per record by step (tools/bench/phases.py)",
    )
    parser.add_argument("--log-level", default="warning")
    return parser


def parse_only(only: str) -> dict[str, set[str]]:
    """{"workload" | "size" | "interval" | "mode": allowed values}; a dimension not named allows everything."""
    dimensions: dict[str, Mapping[str, object]] = {
        "workload": WORKLOADS,
        "size": SIZES,
        "interval": INTERVALS,
        "mode": MODES,
    }
    chosen = {name: set(values) for name, values in dimensions.items()}
    named: set[str] = set()
    for token in filter(None, (t.strip() for t in only.split(","))):
        dimension = next((d for d, values in dimensions.items() if token in values), None)
        if dimension is None:
            raise SystemExit(f"--only: unknown {token!r}")
        if dimension not in named:
            chosen[dimension], named = set(), named | {dimension}
        chosen[dimension].add(token)
    return chosen


def select_cells(chosen: Mapping[str, set[str]], records: int | None, quick: bool) -> list[Cell]:
    sizes = QUICK_RECORDS if quick else DEFAULT_RECORDS
    return [
        Cell(workload, size, interval, records or sizes[SIZES[size]])
        for workload in WORKLOADS
        if workload in chosen["workload"]
        for size in SIZES
        if size in chosen["size"]
        for interval in INTERVALS
        if interval in chosen["interval"]
    ]


def run_matrix(
    cells: Sequence[Cell], modes: Sequence[str], bootstrap: str, timeout_s: float, repeat: int
) -> dict[Cell, dict[str, Result]]:
    results: dict[Cell, dict[str, Result]] = {}
    for cell in cells:
        runs: dict[str, list[Result]] = {mode: [] for mode in modes}
        for _ in range(repeat):  # modes interleaved, so that a burst of load elsewhere hits all of them alike
            for mode in modes:
                started = time.monotonic()
                result = run_mode(cell, mode, bootstrap, timeout_s)
                runs[mode].append(result)
                print(
                    f"{cell.label()} {mode}: {_rate(result.rate)} rec/s over {result.seconds:.2f}s "
                    f"(run took {time.monotonic() - started:.1f}s) {result.error}",
                    file=sys.stderr,
                    flush=True,
                )
                if PHASES is not None:
                    print(f"  {PHASES.take(cell.records)}", file=sys.stderr, flush=True)
        results[cell] = {mode: median(rs) for mode, rs in runs.items()}
    return results


def overhead_table(results: Sequence[overhead.Overhead]) -> str:
    lines = [
        "| workload | records | ours: CPU us per record | the same work by hand | hand / ours |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.app} | {r.records:,} | {r.us_per_record:.2f} | {r.hand_us_per_record:.2f} | {r.ratio:.2f} |"
        for r in results
    ]
    return "\n".join(lines)


def median(results: Sequence[Result]) -> Result:
    """The run with the median rate (the lower one of an even count), knowing the rates of all runs."""
    ok = sorted((r for r in results if r.rate is not None), key=lambda r: r.rate or 0.0)
    chosen = ok[(len(ok) - 1) // 2] if ok else results[0]
    return replace(chosen, runs=tuple(r.rate for r in results))


def load_line(when: str) -> str:
    one, five, _ = os.getloadavg()
    return f"load average {when}: {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


@contextlib.contextmanager
def _phases(wanted: bool) -> Iterator[None]:
    global PHASES
    if not wanted:
        yield
        return
    PHASES = Phases()
    try:
        with PHASES.installed():
            yield
    finally:
        PHASES = None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chosen = parse_only(args.only)
    if args.overhead:
        print(
            overhead_table(
                [
                    overhead.measure(WORKLOADS[w], args.records or 100_000, workload=w)
                    for w in WORKLOADS
                    if w in chosen["workload"]
                ]
            )
        )
        return 0
    started = time.monotonic()
    failed = False
    if not args.profile_only:
        cells = select_cells(chosen, args.records, args.quick)
        producers = [p.strip() for p in args.producers.split(",") if p.strip()]
        if unknown := set(producers) - set(PRODUCERS):
            raise SystemExit(f"--producers: unknown {sorted(unknown)}")
        modes = mode_variants([m for m in MODES if m in chosen["mode"]], producers)
        before = load_line("before")
        with _phases(args.phases):
            results = run_matrix(cells, modes, args.bootstrap_servers, args.timeout, max(1, args.repeat))
        failed = any(r.rate is None for by_mode in results.values() for r in by_mode.values())
        print(table(results), f"\n_{before}; {load_line('after')}_", sep="\n", flush=True)
    if not args.no_profile:
        records = args.records or (QUICK_RECORDS[100] if args.quick else PROFILE_RECORDS)
        print("\n" + profile(args.bootstrap_servers, records, args.timeout, args.top), flush=True)
    print(f"\n(bench took {time.monotonic() - started:.0f}s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
