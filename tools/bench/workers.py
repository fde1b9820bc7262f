"""`python -m tools.bench.workers`: throughput of `pipeline run --workers N` for N = 1 and 2 on a real broker.

Each run: fresh topics (6 input partitions, so 2 workers split them evenly) pre-filled with the same running-totals
records, then `python -m pipeline run --workers N --metrics-port P pipeline.examples.running_totals:app` as a
subprocess, exactly as a user starts it. Progress is read from the one /metrics endpoint (the sum of
pipeline_records_in_total over partitions; under --workers 2 the supervisor's merged multiprocess view) every 50 ms.
Two rates per run: `all`, from the first record processed to the last (includes the rebalance that hands the second
worker its partitions: the local broker has group.initial.rebalance.delay.ms=0), and `steady`, from 20 % to 90 % of
the records. N alternates within each repeat, so both see the same machine; the load average before each run is
printed next to it (other processes share the cores). Medians over the repeats, and the ratio 2/1 of each repeat.
Also the workers' CPU time per record over the `all` window (utime + stime from /proc, the supervisor's not
counted): what N processes cost for the same work, which a crowded machine disturbs far less than the rates.

    python -m tools.bench.workers                        # 300,000 records, 3 repeats (~3 min on 2 cores)
    python -m tools.bench.workers --records 100000 --repeat 1 --workers 1,2,3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipeline.testing.inputs import create_topics, produce_running_totals
from tools.bench.throughput import Cell, Run, cleanup

APP_SPEC = "pipeline.examples.running_totals:app"
PARTITIONS = 6
SAMPLE_S = 0.1
RECORDS_IN = re.compile(rb"^pipeline_records_in_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


@dataclass(frozen=True)
class Measured:
    workers: int
    all_rate: float
    steady_rate: float
    seconds: float
    loadavg: str
    cpu_us_per_record: float


def records_in(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return int(sum(float(v) for v in RECORDS_IN.findall(response.read())))
    except OSError:  # not serving yet
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(bootstrap: str, workers: int, records: int, timeout_s: float, log_dir: Path) -> Measured:
    run_id = f"bench-workers-{workers}-{uuid.uuid4().hex[:6]}"
    run = Run(Cell("running_totals", "100B", "100ms", records), "eos", bootstrap, run_id, {})
    create_topics(bootstrap, {run.input_topic: PARTITIONS, run.output_topic: PARTITIONS})
    total = sum(produce_running_totals(bootstrap, run.input_topic, records, partitions=PARTITIONS).values())
    port = free_port()
    env = {
        **os.environ,
        "PIPELINE_APP_ID": run_id,
        "PIPELINE_INPUT_TOPIC": run.input_topic,
        "PIPELINE_OUTPUT_TOPIC": run.output_topic,
        "PIPELINE_BOOTSTRAP_SERVERS": bootstrap,
    }
    loadavg = Path("/proc/loadavg").read_text().split()[0]
    with open(log_dir / f"{run_id}.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "--log-level",
                "warning",
                "run",
                "--workers",
                str(workers),
                "--metrics-port",
                str(port),
                APP_SPEC,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        samples = sample(port, total, process, workers, timeout_s)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        cleanup(run)
    return rates(workers, samples, total, loadavg)


def workers_cpu_s(process: subprocess.Popen, workers: int) -> float:
    """utime + stime of the processes doing the work: the process itself, or the supervisor's children."""
    pids = [process.pid]
    if workers > 1:
        pids = [int(p) for p in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def sample(
    port: int, total: int, process: subprocess.Popen, workers: int, timeout_s: float
) -> list[tuple[float, int, float]]:
    """(time, records processed, workers' CPU seconds) from the first progress seen until all are processed."""
    deadline = time.monotonic() + timeout_s
    samples: list[tuple[float, int, float]] = []
    while not samples or samples[-1][1] < total:
        if process.poll() is not None:
            raise RuntimeError(f"pipeline run exited ({process.returncode}) before processing all records")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timeout after {timeout_s:.0f}s at {samples[-1][1] if samples else 0}/{total}")
        count, now = records_in(port), time.monotonic()
        if count > 0:
            samples.append((now, count, workers_cpu_s(process, workers)))
        time.sleep(SAMPLE_S)
    return samples


def rates(workers: int, samples: list[tuple[float, int, float]], total: int, loadavg: str) -> Measured:
    def at(fraction: float) -> tuple[float, int, float]:
        return next(s for s in samples if s[1] >= fraction * total)

    (t0, n0, c0), (t1, n1, c1) = samples[0], samples[-1]
    (s0, m0, _), (s1, m1, _) = at(0.2), at(0.9)
    return Measured(
        workers, (n1 - n0) / (t1 - t0), (m1 - m0) / max(s1 - s0, 1e-9), t1 - t0, loadavg, (c1 - c0) / (n1 - n0) * 1e6
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.workers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts, alternated in each repeat")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as log_dir:
        for repeat in range(args.repeat):
            for n in counts:
                m = run_once(args.bootstrap, n, args.records, args.timeout, Path(log_dir))
                results.append(m)
                print(
                    f"repeat {repeat + 1} workers {n}: all {m.all_rate:,.0f} rec/s, steady {m.steady_rate:,.0f} "
                    f"rec/s ({m.seconds:.1f}s; workers' CPU {m.cpu_us_per_record:.1f} us/record; load average "
                    f"{m.loadavg} before)",
                    flush=True,
                )
    print(
        f"\n{args.records:,} running_totals records, {PARTITIONS} partitions, exactly_once, medians of {args.repeat}:"
    )
    base = [m for m in results if m.workers == counts[0]]
    for n in counts:
        mine = [m for m in results if m.workers == n]
        ratios = [m.steady_rate / b.steady_rate for m, b in zip(mine, base, strict=True)]
        cpu = statistics.median(m.cpu_us_per_record for m in mine)
        print(
            f"  workers {n}: all {statistics.median(m.all_rate for m in mine):,.0f} rec/s, steady "
            f"{statistics.median(m.steady_rate for m in mine):,.0f} rec/s; steady ratio to {counts[0]} per repeat "
            f"{', '.join(f'{r:.2f}' for r in ratios)}; workers' CPU {cpu:.1f} us/record; load averages "
            f"{', '.join(m.loadavg for m in mine)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
