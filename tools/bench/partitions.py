"""`python -m tools.bench.partitions`: one instance owning 3 -> 48 -> 192 -> 384 input partitions, both PRODUCERS.

The copier (exactly_once, COMMIT_INTERVAL_MS=100 by default) runs as its own `pipeline run` process (started like
tools/bench/latency.py starts it), alone in its consumer group, over an input topic pre-filled with the same number
of records (100 B values, round robin over the partitions) whatever the partition count; the output topic has as
many partitions as the input. For each run:

    throughput  records/s from the first committed progress to the last record committed: the group's committed
                offsets summed, sampled every 100 ms by a plain consumer of this process (not the instance's
                /metrics, whose text grows with the partitions and would cost the instance's GIL), through
                tools/bench/throughput.py's measure(); group join, fencing and restore are excluded (start-up
                is reported on its own: process start to first progress)
    threads     the peak of `Threads` in /proc/PID/status, sampled every 100 ms over the instance's whole life
    CPU         user + system CPU of the instance over the measured window per record committed in it, in all
                and by thread group (/proc/PID/task: the Python threads, librdkafka's rdk:main and rdk:broker of
                all its clients)
    RSS         VmHWM (the kernel's peak resident set) of the instance at the end of the run, and the median of
                VmRSS over the measured window (the steady state: the peak may be a start-up burst); every
                sample (seconds since start, threads, VmRSS MB) goes to <log dir>/<app id>.proc.csv

Every partition count has its own input topic, filled once and read by every run (each run is a new consumer
group and output topic); the runs are interleaved (round 1: every partition count, both modes alternating; then
round 2 ...), so that a burst of load from elsewhere hits every cell alike; medians of the rounds are reported, and
every run's figures with the load average (1 min) at its start and end. Everything made is deleted at the end.

    python -m tools.bench.partitions                                   # 3,48,192,384 x both modes x 3 rounds
    python -m tools.bench.partitions --partitions 3,384 --repeat 1 --records 300000    # a smoke run
    python -m tools.bench.partitions --env PIPELINE_GROUP_PROTOCOL=consumer

Results: BENCHMARKS.md ("Producers per process (KIP-447)").
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from pipeline.settings import PER_PARTITION, PER_PROCESS
from pipeline.testing.inputs import create_topics, produce_copier
from tools.bench import latency, throughput

log = logging.getLogger("tools.bench.partitions")

PRODUCERS = (PER_PARTITION, PER_PROCESS)
SAMPLE_S = 0.1
# The filling producer's linger: at 384 partitions its record batches hold ~15 records, at 3 thousands (batch.size
# 1 MB). The instance reads them batch by batch: --fill-linger-ms 2000 gives 384 partitions batches as large.
FILL_LINGER_MS = 20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat counts CPU time in these
DEFAULT_RECORDS = 1_500_000  # about 14 s at 3 partitions (~105k rec/s on 2 shared cores)
VALUE_SIZE = 100


@dataclass
class Sample:
    """The instance's /proc figures over its life."""

    peak_threads: int = 0
    hwm_mb: float = 0.0  # VmHWM: the peak resident set
    rss_window_mb: float = 0.0  # median VmRSS between the first and the last committed progress
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (monotonic, threads, VmRSS MB)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, the process's user + system CPU s)
    cpu_us_per_record: float = 0.0  # over the measured window: its CPU / the records committed in it
    # (monotonic, thread group -> CPU s of its threads): the groups of thread_group()
    threads_cpu: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    cpu_us_by_thread: dict[str, float] = field(default_factory=dict)  # group -> CPU us per record over the window

    def cpu_rate_between(self, start: float, end: float) -> float:
        """CPU seconds per second of the window's samples (the first at or after start, the last at or before
        end)."""
        window = [(t, cpu) for t, cpu in self.cpu if start <= t <= end]
        if len(window) < 2 or window[-1][0] <= window[0][0]:
            return 0.0
        return (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])

    def cpu_by_thread_between(self, start: float, end: float) -> dict[str, float]:
        """Thread group -> CPU seconds per second over the window (a group's threads that ended in it are lost)."""
        window = [(t, groups) for t, groups in self.threads_cpu if start <= t <= end]
        if len(window) < 2 or window[-1][0] <= window[0][0]:
            return {}
        (t0, first), (t1, last) = window[0], window[-1]
        return {group: (cpu - first.get(group, 0.0)) / (t1 - t0) for group, cpu in last.items()}

    def rss_between(self, start: float, end: float) -> float:
        window = [rss for t, _, rss in self.timeline if start <= t <= end]
        return statistics.median(window) if window else 0.0

    def write(self, path: Path, started: float) -> None:
        path.write_text(
            "seconds,threads,rss_mb\n" + "".join(f"{t - started:.2f},{n},{rss:.1f}\n" for t, n, rss in self.timeline)
        )


@dataclass
class RunResult:
    partitions: int
    producers: str
    rate: float | None
    seconds: float = 0.0
    startup_s: float = 0.0  # process start to the first committed progress
    proc: Sample = field(default_factory=Sample)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and at the end
    warnings: list[str] = field(default_factory=list)  # WARNING / ERROR lines of the instance's log
    error: str = ""


def thread_group(name: str) -> str:
    """A thread's name (comm) without its number: librdkafka's rdk:main and rdk:broker<N> of every client, the
    Python threads (named after the process: Python does not name them in the kernel)."""
    return name.rstrip("0123456789-") if name.startswith("rdk:") else "python"


class ProcWatcher:
    """Samples /proc/PID/status of the instance on a thread until stopped (or the process is gone)."""

    def __init__(self, pid: int) -> None:
        self.sample = Sample()
        self._path = Path(f"/proc/{pid}/status")
        self._stat = Path(f"/proc/{pid}/stat")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"proc-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(SAMPLE_S)

    def read(self) -> None:
        try:
            fields = dict(line.split(":", 1) for line in self._path.read_text().splitlines() if ":" in line)
        except OSError:  # the process is gone
            return
        s, threads = self.sample, int(fields["Threads"])
        s.peak_threads = max(s.peak_threads, threads)
        s.hwm_mb = max(s.hwm_mb, int(fields["VmHWM"].split()[0]) / 1024)
        s.timeline.append((time.monotonic(), threads, int(fields["VmRSS"].split()[0]) / 1024))
        try:  # utime and stime: the 14th and 15th fields, after the command's parenthesised name
            ticks = self._stat.read_text().rpartition(")")[2].split()[11:13]
        except OSError:
            return
        s.cpu.append((time.monotonic(), sum(int(t) for t in ticks) / CLOCK_TICKS))
        s.threads_cpu.append((time.monotonic(), self._threads_cpu()))

    def _threads_cpu(self) -> dict[str, float]:
        groups: dict[str, float] = {}
        for stat in self._stat.parent.glob("task/*/stat"):
            try:
                name, _, rest = stat.read_text().partition("(")[2].rpartition(")")
            except OSError:  # the thread ended
                continue
            group = thread_group(name)
            groups[group] = groups.get(group, 0.0) + sum(int(t) for t in rest.split()[11:13]) / CLOCK_TICKS
        return groups

    def stop(self) -> Sample:
        self._stop.set()
        self._thread.join(5)
        return self.sample


class CommittedProgress:
    """The group's committed offsets of the input, summed (records processed and committed), from this process."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.first_seen: float | None = None

    def __call__(self) -> int:
        total = sum(max(tp.offset, 0) for tp in self._consumer.committed(self._tps, timeout=10))
        if total and self.first_seen is None:
            self.first_seen = time.monotonic()
        return total

    def close(self) -> None:
        self._consumer.close()


class InstanceLiveness:
    """throughput.measure()'s view of the instance process: alive while it runs; its exit code and log tail if not."""

    def __init__(self, instance: latency.Pipeline) -> None:
        self._instance = instance
        self.error: str | None = None

    def alive(self) -> bool:
        code = self._instance.process.poll()
        if code is not None and self.error is None:
            self.error = f"instance exited {code}:\n{self._instance.tail()}"
        return code is None


@dataclass(frozen=True)
class Bench:
    bootstrap: str
    records: int
    interval_ms: int
    log_dir: Path
    extra_env: Mapping[str, str]
    timeout_s: float
    fill_linger_ms: int = FILL_LINGER_MS
    prefix: str = field(default_factory=lambda: f"bench-parts-{uuid.uuid4().hex[:6]}")

    def input_topic(self, partitions: int) -> str:
        return f"{self.prefix}-{partitions}-input"

    def fill(self, partitions: int) -> None:
        topic = self.input_topic(partitions)
        create_topics(self.bootstrap, {topic: partitions})
        linger = {"linger.ms": self.fill_linger_ms}  # with the partition count, it sets the input's batch sizes
        counts = produce_copier(
            self.bootstrap, topic, self.records, partitions=partitions, value_size=VALUE_SIZE, extra_config=linger
        )
        assert sum(counts.values()) == self.records, counts

    def run(self, partitions: int, producers: str) -> RunResult:
        app_id = f"{self.prefix}-{partitions}-{producers.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
        out_topic = f"{app_id}-out"
        create_topics(self.bootstrap, {out_topic: partitions})
        result = RunResult(partitions, producers, None, load=(os.getloadavg()[0], 0.0))
        progress = CommittedProgress(self.bootstrap, app_id, self.input_topic(partitions), partitions)
        started = time.monotonic()
        instance = latency.Pipeline.start(
            Path.cwd(),
            self.bootstrap,
            app_id,
            (self.input_topic(partitions), out_topic),
            latency.Cell("eos", self.interval_ms, 0),
            {**self.extra_env, "PIPELINE_PRODUCERS": producers},
            self.log_dir,
        )
        watcher = ProcWatcher(instance.process.pid)
        try:
            measured = throughput.measure(
                progress, self.records, InstanceLiveness(instance), self.timeout_s, sample_s=SAMPLE_S
            )
            result.rate, result.seconds, result.error = measured.rate, measured.seconds, measured.error
            result.startup_s = (progress.first_seen or started) - started
            watcher.read()
            window = (progress.first_seen or started, time.monotonic())
            watcher.sample.rss_window_mb = watcher.sample.rss_between(*window)
            if result.rate:  # CPU s per s / records per s
                watcher.sample.cpu_us_per_record = watcher.sample.cpu_rate_between(*window) / result.rate * 1e6
                by_thread = watcher.sample.cpu_by_thread_between(*window).items()
                watcher.sample.cpu_us_by_thread = {g: cpu / result.rate * 1e6 for g, cpu in by_thread}
        except throughput.BenchError as e:
            result.error = str(e)
        finally:
            result.proc = watcher.stop()
            result.proc.write(self.log_dir / f"{app_id}.proc.csv", started)
            instance.stop()
            progress.close()
            result.warnings = [
                line
                for line in instance.log_path.read_text(errors="replace").splitlines()
                if " WARNING " in line or " ERROR " in line or "Traceback" in line
            ]
            latency.cleanup(self.bootstrap, app_id)
        result.load = (result.load[0], os.getloadavg()[0])
        return result

    def cleanup(self, partitions: Sequence[int]) -> None:
        for n in partitions:
            latency.cleanup(self.bootstrap, self.input_topic(n))


# -- report ------------------------------------------------------------------------------------------------------------
def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def median_rate(results: Sequence[RunResult]) -> float | None:
    return _median([r.rate for r in results if r.rate])


def row(r: RunResult) -> str:
    return (
        f"| {r.partitions} | {r.producers} | {throughput._rate(r.rate)} | {r.seconds:.1f} | {r.startup_s:.1f} "
        f"| {r.proc.cpu_us_per_record:.2f} "
        f"| {r.proc.peak_threads} | {r.proc.hwm_mb:.0f} | {r.proc.rss_window_mb:.0f} | {len(r.warnings)} "
        f"| {r.load[0]:.1f} / {r.load[1]:.1f} |" + (f" {r.error.splitlines()[0]}" if r.error else "")
    )


def summary(results: Sequence[RunResult], partitions: Sequence[int], producers: Sequence[str]) -> list[str]:
    """Medians per partition count and mode, and the ratios: N partitions / the smallest count, per_process /
    per_partition (the median rates of the same sitting)."""
    cells = {
        (n, p): [r for r in results if r.partitions == n and r.producers == p] for n in partitions for p in producers
    }
    base = partitions[0]
    lines = [
        f"| partitions | producers | rec/s (median) | x {base} partitions | per_process / per_partition "
        f"| CPU us per record | CPU x {base} partitions | peak threads | peak RSS MB (VmHWM) "
        f"| peak RSS x {base} partitions | steady RSS MB | start-up s | every run rec/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (n, p), runs in cells.items():
        rate, base_rate = median_rate(runs), median_rate(cells[(base, p)])
        other = median_rate(cells.get((n, PER_PARTITION), []))
        hwm = _median([r.proc.hwm_mb for r in runs if r.rate])
        base_hwm = _median([r.proc.hwm_mb for r in cells[(base, p)] if r.rate])
        cpu = _median([r.proc.cpu_us_per_record for r in runs if r.rate])
        base_cpu = _median([r.proc.cpu_us_per_record for r in cells[(base, p)] if r.rate])
        lines.append(
            f"| {n} | {p} | {_fmt(rate)} | {_fmt(rate / base_rate if rate and base_rate else None, '.2f')} "
            f"| {_fmt(rate / other if p == PER_PROCESS and rate and other else None, '.2f')} "
            f"| {_fmt(cpu, '.2f')} | {_fmt(cpu / base_cpu if cpu and base_cpu else None, '.2f')} "
            f"| {_fmt(_median([r.proc.peak_threads for r in runs if r.rate]))} | {_fmt(hwm)} "
            f"| {_fmt(hwm / base_hwm if hwm and base_hwm else None, '.2f')} "
            f"| {_fmt(_median([r.proc.rss_window_mb for r in runs if r.rate]))} "
            f"| {_fmt(_median([r.startup_s for r in runs if r.rate]), '.1f')} "
            f"| {' / '.join(throughput._rate(r.rate) for r in runs)} |"
        )
    return lines


def by_thread(results: Sequence[RunResult], partitions: Sequence[int], producers: Sequence[str]) -> list[str]:
    """The medians of CPU us per record by thread group (the Python threads, librdkafka's of every client)."""
    groups = sorted({g for r in results for g in r.proc.cpu_us_by_thread})
    lines = [
        "CPU us per record by thread (medians): " + ", ".join(groups),
        "",
        "| partitions | producers | " + " | ".join(groups) + " |",
        "|---:|---|" + "---:|" * len(groups),
    ]
    for n in partitions:
        for p in producers:
            runs = [r for r in results if r.partitions == n and r.producers == p and r.rate]
            cells = [_fmt(_median([r.proc.cpu_us_by_thread.get(g, 0.0) for r in runs]), ".2f") for g in groups]
            lines.append(f"| {n} | {p} | " + " | ".join(cells) + " |")
    return lines


def report(results: Sequence[RunResult], partitions: Sequence[int], producers: Sequence[str]) -> str:
    header = (
        "| partitions | producers | rec/s | measured s | start-up s | CPU us per record | peak threads | peak RSS MB "
        "| steady RSS MB | warning lines | load avg start / end |"
    )
    lines = [
        *summary(results, partitions, producers),
        "",
        "Every run, in order:",
        "",
        header,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *(row(r) for r in results),
    ]
    lines += ["", *by_thread(results, partitions, producers)]
    warned = [r for r in results if r.warnings]
    if warned:
        lines += ["", "Instance log lines at WARNING and above (first 3 per run):"]
        lines += [f"- {r.partitions} {r.producers}: {w}" for r in warned for w in r.warnings[:3]]
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.partitions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument(
        "--partitions",
        default="3,48,192,384",
        help="input partition counts (default 3,48,192,384); the first is the base of the ratios",
    )
    parser.add_argument("--producers", default=",".join(PRODUCERS), help="PRODUCERS values, alternating per run")
    parser.add_argument(
        "--records",
        type=int,
        default=DEFAULT_RECORDS,
        help=f"input records per partition count (default {DEFAULT_RECORDS:,})",
    )
    parser.add_argument(
        "--fill-linger-ms",
        type=int,
        default=FILL_LINGER_MS,
        help=f"linger.ms of the producer filling the inputs (default {FILL_LINGER_MS}): their batch sizes",
    )
    parser.add_argument("--interval", type=int, default=100, help="COMMIT_INTERVAL_MS (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3); medians are reported")
    parser.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="seconds allowed for one run's records (default: 60 + records / 5,000)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the instance, e.g. PIPELINE_GROUP_PROTOCOL=consumer",
    )
    parser.add_argument("--log-dir", default="", help="keep the instances' logs here (default: a temporary directory)")
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    partitions = [int(n) for n in args.partitions.split(",")]
    producers = [p.strip() for p in args.producers.split(",") if p.strip()]
    if unknown := set(producers) - set(PRODUCERS):
        raise SystemExit(f"--producers: unknown {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        log_dir = Path(args.log_dir or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        bench = Bench(
            args.bootstrap_servers,
            args.records,
            args.interval,
            log_dir,
            dict(item.split("=", 1) for item in args.env),
            args.timeout or 60 + args.records / 5_000,
            args.fill_linger_ms,
        )
        results: list[RunResult] = []
        started, before = time.monotonic(), throughput.load_line("before")
        try:
            for n in partitions:
                bench.fill(n)
                print(f"filled {bench.input_topic(n)}: {args.records:,} records", file=sys.stderr, flush=True)
            for _ in range(max(1, args.repeat)):
                for n in partitions:
                    for p in producers:
                        results.append(bench.run(n, p))
                        print(row(results[-1]), file=sys.stderr, flush=True)
        finally:
            bench.cleanup(partitions)
    print(report(results, partitions, producers), f"\n_{before}; {throughput.load_line('after')}_", sep="\n")
    print(f"\n(bench took {time.monotonic() - started:.0f}s)", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
