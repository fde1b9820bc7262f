"""The PRODUCERS benchmarks compare what they claim: `python -m tools.bench --producers` runs every Runner mode once
per PRODUCERS value and a per_process mode gets PRODUCERS=per_process; `python -m tools.bench.partitions` reads its
instance's /proc figures and puts its ratios against the right base (no broker; milliseconds)."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.settings import EXACTLY_ONCE, PER_PARTITION, PER_PROCESS, Settings
from tools.bench import partitions, throughput


def test_every_runner_mode_runs_once_per_producers_value_and_raw_once() -> None:
    variants = throughput.mode_variants(["raw", "alo", "eos"], [PER_PROCESS, PER_PARTITION])
    assert variants == ["raw", "alo", "eos", "alo-per_partition", "eos-per_partition"]
    assert throughput.mode_variants(["eos"], [PER_PARTITION]) == ["eos-per_partition"]


def test_a_plain_mode_runs_the_default_producers_and_a_suffixed_one_the_other() -> None:
    cell = throughput.Cell("copier", "100B", "100ms", 10)
    run = throughput.Run(cell, "eos-per_partition", "127.0.0.1:1", "bench-test", {})
    runner = throughput.make_runner(run)
    assert (runner.settings.producers, runner.settings.processing_guarantee) == (PER_PARTITION, EXACTLY_ONCE)
    plain = throughput.make_runner(throughput.Run(cell, "eos", "127.0.0.1:1", "b", {}))
    assert plain.settings.producers == PER_PROCESS == Settings().producers  # what a user who sets nothing runs


def test_the_watcher_reads_threads_and_rss_of_a_process() -> None:
    watcher = partitions.ProcWatcher(os.getpid())
    sample = watcher.stop()
    assert sample.peak_threads >= 1 and sample.hwm_mb > 0 and sample.timeline
    assert sample.rss_between(0, float("inf")) > 0


def test_ratios_are_against_the_first_partition_count_and_per_partition(tmp_path: Path) -> None:
    def run(n: int, producers: str, rate: float, hwm: float, cpu: float) -> partitions.RunResult:
        sample = partitions.Sample(peak_threads=n, hwm_mb=hwm, cpu_us_per_record=cpu)
        return partitions.RunResult(n, producers, rate, proc=sample)

    results = [
        run(3, PER_PARTITION, 100.0, 100.0, 8.0),
        run(3, PER_PROCESS, 100.0, 100.0, 10.0),
        run(384, PER_PARTITION, 50.0, 600.0, 20.0),
        run(384, PER_PROCESS, 90.0, 150.0, 12.0),
    ]
    rows = partitions.summary(results, [3, 384], [PER_PARTITION, PER_PROCESS])
    per_process_384 = next(r for r in rows if r.startswith("| 384 | per_process"))
    cells = [c.strip() for c in per_process_384.split("|")[1:-1]]
    assert cells[2:10] == ["90", "0.90", "1.80", "12.00", "1.20", "384", "150", "1.50"]
