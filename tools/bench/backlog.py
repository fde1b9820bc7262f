"""`python -m tools.bench.backlog`: how fast one instance drains a backlog at 3, 48 and 384 partitions (issue 23).

The measurement: one instance as its own `pipeline run` process, alone in its group, over an input topic that holds
a backlog of 600,000 records (100 B values) spread evenly over its partitions, whatever their number; the rate is
taken from what the instance committed, sampled every 100 ms by this process, from the first commit seen to the last
record committed (start-up, fencing and the group join are not in it).

    --sink kafka     the exactly-once copier (COMMIT_INTERVAL_MS=100); committed = the group's committed offsets,
                     summed; every PRODUCERS mode (per_process, per_partition)
    --sink postgres  running_totals_pg (20,000 accounts, so that every partition has records); committed = the sum of
                     next_offset in its pipeline_offsets table (a schema of its own per run)

The output topic (Kafka sink): by default one per partition count, created and written to before the first run
("written"), as the output of a service catching up after an outage is. The broker's first appends to a partition
create and first touch its index files: on this machine about 7 ms of broker CPU per partition (BENCHMARKS.md), a
cost of the topic's first minutes that would otherwise be charged to every 384-partition run. `--fresh-output`
creates a new output topic for every run instead (what tools/bench/partitions.py does).

Per run: the rate; the instance's CPU (utime + stime of /proc/PID/stat) per record over the same window, the figure
that the load of a shared machine moves least; peak threads; peak RSS (VmHWM) and the median VmRSS over the window;
the load average (1 min) at its start and end; with `--broker-pid`, a local broker's CPU per record over the same
window (it shares the machine's cores with the instance). Runs are interleaved (each round: every partition count,
every mode; every other round in the reverse order), so that load from elsewhere hits every cell alike; the tables
give the medians, the ratios of the medians against the smallest partition count, and the median of the per-round
ratios.

    pipeline bench partitions                                        # = python -m tools.bench.backlog
    python -m tools.bench.backlog                                    # 3,48,384 x both modes x 5 rounds (~8 min)
    python -m tools.bench.backlog --sink postgres --dsn postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline
    python -m tools.bench.backlog --partitions 3,384 --repeat 1 --producers per_process       # a smoke run

Results: BENCHMARKS.md ("Backlog drain at 3, 48 and 384 partitions").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import KafkaException, Producer
from psycopg import sql

from pipeline.settings import PER_PARTITION, PER_PROCESS
from pipeline.testing.inputs import create_topics, produce_copier, produce_running_totals
from tools.bench import latency, throughput
from tools.bench.partitions import CommittedProgress, ProcWatcher, Sample

RECORDS = 600_000
VALUE_SIZE = 100
ACCOUNTS = 20_000
SAMPLE_S = 0.1
DEFAULT_DSN = "postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline"
APPS = {"kafka": "pipeline.examples.copier:app", "postgres": "pipeline.examples.running_totals_pg:app"}


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Instance:
    """One `pipeline run` process and its log."""

    process: subprocess.Popen[bytes]
    log_path: Path
    error: BaseException | str | None = None

    @classmethod
    def start(cls, app: str, env: Mapping[str, str], log_path: Path) -> Instance:
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "--log-level", "warning", "run", app],
                env={**os.environ, "PYTHONPATH": str(Path.cwd()), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return cls(process, log_path)

    def alive(self) -> bool:
        """throughput.measure()'s liveness: its exit code and log tail once it is gone."""
        code = self.process.poll()
        if code is not None and self.error is None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
            self.error = f"instance exited {code}:\n" + "\n".join(tail)
        return code is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def warnings(self) -> list[str]:
        text = self.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line or "Traceback" in line]


class Progress:
    """Records committed so far (a callable for throughput.measure()), and the instance's CPU when the first commit
    was seen."""

    def __init__(
        self, committed: Callable[[], int], pid: int, close: Callable[[], None] = lambda: None, broker: int = 0
    ) -> None:
        self._committed, self._pid, self.close, self._broker = committed, pid, close, broker
        self.first_seen: float | None = None
        self.cpu_at_first: float | None = None
        self.broker_cpu_at_first: float | None = None
        self.first_count = 0
        self._last = 0

    def __call__(self) -> int:
        try:
            total = self._last = self._committed()
        except (KafkaException, psycopg.Error) as e:  # a sample lost on a loaded machine: the next one will do
            print(f"progress not read ({e}); reading again", file=sys.stderr, flush=True)
            return self._last
        if total and self.first_seen is None:
            self.first_seen, self.cpu_at_first, self.first_count = time.monotonic(), cpu_seconds(self._pid), total
            self.broker_cpu_at_first = cpu_seconds(self._broker) if self._broker else None
        return total


def postgres_committed(dsn: str, schema: str, app_id: str) -> Callable[[], int]:
    """The sum of next_offset over the app's partitions in its offsets table (0 until the table exists)."""
    query = sql.SQL("SELECT coalesce(sum(next_offset), 0) FROM {} WHERE app_id = %s").format(
        sql.Identifier(schema, "pipeline_offsets")
    )

    def committed() -> int:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(query, (app_id,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0

    return committed


@dataclass
class RunResult:
    partitions: int
    mode: str  # the PRODUCERS mode, or "postgres"
    round: int
    rate: float | None = None
    seconds: float = 0.0
    cpu_us: float | None = None  # instance CPU per record over the measured window, microseconds
    broker_cpu_us: float | None = None  # the same for the broker's process (--broker-pid)
    proc: Sample = field(default_factory=Sample)
    load: tuple[float, float] = (0.0, 0.0)
    warnings: list[str] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Bench:
    sink: str
    bootstrap: str
    dsn: str
    records: int
    interval_ms: int
    fresh_output: bool
    log_dir: Path
    extra_env: Mapping[str, str]
    timeout_s: float
    broker_pid: int = 0  # a local broker's process: its CPU over each measured window too (0: not measured)
    prefix: str = field(default_factory=lambda: f"bench-backlog-{uuid.uuid4().hex[:6]}")

    def input_topic(self, partitions: int) -> str:
        return f"{self.prefix}-{partitions}-input"

    def output_topic(self, partitions: int) -> str:
        return f"{self.prefix}-{partitions}-output"

    def fill(self, partitions: int) -> None:
        """The backlog, and (Kafka sink, unless --fresh-output) the written output topic."""
        topic = self.input_topic(partitions)
        create_topics(self.bootstrap, {topic: partitions})
        if self.sink == "kafka":
            counts = produce_copier(self.bootstrap, topic, self.records, partitions=partitions, value_size=VALUE_SIZE)
            if not self.fresh_output:
                create_topics(self.bootstrap, {self.output_topic(partitions): partitions})
                write_every_partition(self.bootstrap, self.output_topic(partitions), partitions)
        else:
            counts = produce_running_totals(
                self.bootstrap, topic, self.records, partitions=partitions, accounts=ACCOUNTS, value_size=VALUE_SIZE
            )
        assert sum(counts.values()) == self.records, counts

    def run(self, partitions: int, mode: str, round_: int) -> RunResult:
        app_id = f"{self.prefix}-{partitions}-{mode.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
        result = RunResult(partitions, mode, round_, load=(os.getloadavg()[0], 0.0))
        env = {**self.extra_env, **self._env(app_id, partitions, mode)}
        instance = Instance.start(APPS[self.sink], env, self.log_dir / f"{app_id}.log")
        watcher = ProcWatcher(instance.process.pid)
        progress = self._progress(app_id, partitions, instance.process.pid)
        try:
            measured = throughput.measure(progress, self.records, instance, self.timeout_s, sample_s=SAMPLE_S)
            cpu_end, window_end = cpu_seconds(instance.process.pid), time.monotonic()
            broker_end = cpu_seconds(self.broker_pid) if self.broker_pid else None
            result.rate, result.seconds, result.error = measured.rate, measured.seconds, measured.error
            measured_records = self.records - progress.first_count
            if cpu_end is not None and progress.cpu_at_first is not None:
                result.cpu_us = (cpu_end - progress.cpu_at_first) / measured_records * 1e6
            if broker_end is not None and progress.broker_cpu_at_first is not None:
                result.broker_cpu_us = (broker_end - progress.broker_cpu_at_first) / measured_records * 1e6
            watcher.read()
            watcher.sample.rss_window_mb = watcher.sample.rss_between(progress.first_seen or 0.0, window_end)
        except throughput.BenchError as e:
            result.error = str(e)
        finally:
            result.proc = watcher.stop()
            instance.stop()
            progress.close()
            result.warnings = instance.warnings()
            self._cleanup_run(app_id)
        result.load = (result.load[0], os.getloadavg()[0])
        return result

    def _env(self, app_id: str, partitions: int, mode: str) -> dict[str, str]:
        env = {
            "PIPELINE_BOOTSTRAP_SERVERS": self.bootstrap,
            "PIPELINE_APP_ID": app_id,
            "PIPELINE_INPUT_TOPIC": self.input_topic(partitions),
            "PIPELINE_COMMIT_INTERVAL_MS": str(self.interval_ms),
        }
        if self.sink == "postgres":
            schema = schema_name(app_id)
            return env | {
                "PIPELINE_SINK": "postgres",
                "PIPELINE_POSTGRES_DSN": self.dsn,
                "PIPELINE_POSTGRES_SCHEMA": schema,
            }
        output = f"{app_id}-out" if self.fresh_output else self.output_topic(partitions)
        if self.fresh_output:
            create_topics(self.bootstrap, {output: partitions})
        return env | {"PIPELINE_OUTPUT_TOPIC": output, "PIPELINE_PRODUCERS": mode}

    def _progress(self, app_id: str, partitions: int, pid: int) -> Progress:
        if self.sink == "postgres":
            return Progress(postgres_committed(self.dsn, schema_name(app_id), app_id), pid, broker=self.broker_pid)
        committed = CommittedProgress(self.bootstrap, app_id, self.input_topic(partitions), partitions)
        return Progress(committed, pid, committed.close, broker=self.broker_pid)

    def _cleanup_run(self, app_id: str) -> None:
        latency.cleanup(self.bootstrap, app_id)  # the group, and a fresh output topic
        if self.sink == "postgres":
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name(app_id))))

    def cleanup(self) -> None:
        latency.cleanup(self.bootstrap, self.prefix)


def schema_name(app_id: str) -> str:
    return app_id.replace("-", "_")


def write_every_partition(bootstrap: str, topic: str, partitions: int) -> None:
    """Appends to every partition twice, the first append over index.interval.bytes (4096): the second one writes
    the partition's first index entries, so the broker has created and touched its index files, as it has for the
    output topic of a service that has been running."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for size in (5_000, 100):
        for p in range(partitions):
            producer.produce(topic, b"x" * size, b"warm-up", partition=p)
        if producer.flush(60):
            raise RuntimeError(f"{topic}: the warm-up writes were not delivered within 60 s")


# -- report ------------------------------------------------------------------------------------------------------------
def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell_line(runs: Sequence[RunResult], base: Sequence[RunResult]) -> str:
    """One summary row: medians of `runs`, and their ratios against the same mode's `base` runs."""
    ok, base_ok = [r for r in runs if r.rate], [r for r in base if r.rate]
    rate, base_rate = _median([r.rate for r in ok]), _median([r.rate for r in base_ok])
    by_round = {r.round: r.rate for r in base_ok}
    round_ratios = [_ratio(r.rate, by_round.get(r.round)) for r in ok]
    cpu, base_cpu = _median([r.cpu_us for r in ok]), _median([r.cpu_us for r in base_ok])
    hwm, base_hwm = _median([r.proc.hwm_mb for r in ok]), _median([r.proc.hwm_mb for r in base_ok])
    steady, base_steady = _median([r.proc.rss_window_mb for r in ok]), _median([r.proc.rss_window_mb for r in base_ok])
    loads = [load for r in runs for load in r.load]
    every = " / ".join(f"{throughput._rate(r.rate)} [{r.load[0]:.1f}]" for r in runs)
    return (
        f"| {runs[0].partitions} | {runs[0].mode} | {_fmt(rate)} | {_fmt(_ratio(rate, base_rate), '.2f')} "
        f"| {_fmt(_median(round_ratios), '.2f')} | {_fmt(cpu, '.1f')} | {_fmt(_ratio(cpu, base_cpu), '.2f')} "
        f"| {_fmt(hwm)} | {_fmt(_ratio(hwm, base_hwm), '.2f')} | {_fmt(steady)} "
        f"| {_fmt(_ratio(steady, base_steady), '.2f')} | {_fmt(_median([r.proc.peak_threads for r in ok]))} "
        f"| {min(loads):.1f}-{max(loads):.1f} | {every} |"
    )


def summary(results: Sequence[RunResult], partitions: Sequence[int], modes: Sequence[str]) -> list[str]:
    base = partitions[0]
    lines = [
        f"| partitions | mode | rec/s (median) | x {base} partitions | per round x {base} (median) | CPU us/record "
        f"| CPU x {base} | peak RSS MB | peak RSS x {base} | steady RSS MB | steady RSS x {base} | peak threads "
        "| load avg (1 min) | every run rec/s [load at start] |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for mode in modes:
        base_runs = [r for r in results if r.partitions == base and r.mode == mode]
        for n in partitions:
            runs = [r for r in results if r.partitions == n and r.mode == mode]
            if runs:
                lines.append(_cell_line(runs, base_runs))
    return lines


# Issue 23's targets: the largest partition count's drain against the smallest's, same rounds (none for PostgreSQL).
TARGETS = {PER_PROCESS: 0.9, PER_PARTITION: 0.7}


def ratios(results: Sequence[RunResult], partitions: Sequence[int], modes: Sequence[str]) -> list[str]:
    """One line per mode: the median rate at the largest partition count over the median at the smallest, the
    median of the per-round ratios beside it, and the target it is held to."""
    low, high = partitions[0], partitions[-1]
    lines = []
    for mode in modes:
        rates = {n: [r for r in results if r.partitions == n and r.mode == mode and r.rate] for n in (low, high)}
        ratio = _ratio(_median([r.rate for r in rates[high]]), _median([r.rate for r in rates[low]]))
        by_round = {r.round: r.rate for r in rates[low]}
        per_round = _median([_ratio(r.rate, by_round.get(r.round)) for r in rates[high]])
        target = TARGETS.get(mode)
        verdict = (
            ""
            if target is None or ratio is None
            else f" (target >= {target}: {'met' if ratio >= target else 'NOT met'})"
        )
        lines.append(
            f"{mode}: {high} / {low} partitions = {_fmt(ratio, '.2f')}{verdict}; per round {_fmt(per_round, '.2f')}"
        )
    return lines


def run_line(r: RunResult) -> str:
    return (
        f"| {r.round} | {r.partitions} | {r.mode} | {throughput._rate(r.rate)} | {r.seconds:.1f} "
        f"| {_fmt(r.cpu_us, '.1f')} | {_fmt(r.broker_cpu_us, '.1f')} | {r.proc.peak_threads} | {r.proc.hwm_mb:.0f} "
        f"| {r.proc.rss_window_mb:.0f} "
        f"| {len(r.warnings)} "
        f"| {r.load[0]:.1f} / {r.load[1]:.1f} |" + (f" {r.error.splitlines()[0]}" if r.error else "")
    )


def report(results: Sequence[RunResult], partitions: Sequence[int], modes: Sequence[str]) -> str:
    lines = [
        *ratios(results, partitions, modes),
        "",
        *summary(results, partitions, modes),
        "",
        "Every run, in order:",
        "",
        "| round | partitions | mode | rec/s | measured s | CPU us/record | broker CPU us/record | peak threads "
        "| peak RSS MB | steady RSS MB "
        "| warning lines | load avg start / end |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *(run_line(r) for r in results),
    ]
    warned = [r for r in results if r.warnings]
    if warned:
        lines += ["", "Instance log lines at WARNING and above (first 3 per run):"]
        lines += [f"- round {r.round}, {r.partitions} {r.mode}: {w}" for r in warned for w in r.warnings[:3]]
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.backlog", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sink", choices=sorted(APPS), default="kafka")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="--sink postgres: the database")
    parser.add_argument("--partitions", default="3,48,384", help="the first is the base of the ratios")
    parser.add_argument("--producers", default=f"{PER_PROCESS},{PER_PARTITION}", help="--sink kafka: PRODUCERS modes")
    parser.add_argument("--records", type=int, default=RECORDS, help=f"the backlog (default {RECORDS:,})")
    parser.add_argument("--interval", type=int, default=100, help="COMMIT_INTERVAL_MS (default 100)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5); medians are reported")
    parser.add_argument("--fresh-output", action="store_true", help="a new output topic for every run")
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per run (default 60 + records / 5,000)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more instance environment")
    parser.add_argument(
        "--broker-pid", type=int, default=0, help="a local broker's PID: its CPU per record over each window too"
    )
    parser.add_argument("--log-dir", default="", help="keep the instances' logs here (default: a temporary directory)")
    return parser


def run_rounds(bench: Bench, partitions: Sequence[int], modes: Sequence[str], repeat: int) -> list[RunResult]:
    results: list[RunResult] = []
    for round_ in range(1, max(1, repeat) + 1):
        for n in partitions if round_ % 2 else list(reversed(partitions)):
            for mode in modes if round_ % 2 else list(reversed(modes)):
                results.append(bench.run(n, mode, round_))
                print(run_line(results[-1]), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    partitions = [int(n) for n in args.partitions.split(",")]
    modes = [m.strip() for m in args.producers.split(",") if m.strip()] if args.sink == "kafka" else ["postgres"]
    if unknown := set(modes) - {PER_PROCESS, PER_PARTITION, "postgres"}:
        raise SystemExit(f"--producers: unknown {sorted(unknown)}")
    started, before = time.monotonic(), throughput.load_line("before")
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as tmp:
        log_dir = Path(args.log_dir or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        extra_env = dict(item.split("=", 1) for item in args.env)
        timeout_s = args.timeout or 60 + args.records / 5_000
        bench = Bench(
            args.sink,
            args.bootstrap_servers,
            args.dsn,
            args.records,
            args.interval,
            args.fresh_output,
            log_dir,
            extra_env,
            timeout_s,
            args.broker_pid,
        )
        try:
            for n in partitions:
                bench.fill(n)
                print(f"filled {bench.input_topic(n)}: {args.records:,} records", file=sys.stderr, flush=True)
            results = run_rounds(bench, partitions, modes, args.repeat)
        finally:
            with contextlib.suppress(Exception):
                bench.cleanup()
    output = "fresh per run" if args.fresh_output else "written before the runs"
    print(f"sink {args.sink}, {args.records:,} records, COMMIT_INTERVAL_MS={args.interval}, output topic {output}\n")
    print(report(results, partitions, modes), f"\n_{before}; {throughput.load_line('after')}_", sep="\n")
    print(f"\n(bench took {time.monotonic() - started:.0f}s)", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
