"""`pipeline bench partitions` (tools/bench/backlog.py, issue 23) prints the ratio it is judged by, against the right
base and target, and the command says what to do where the benchmarks are not (no broker; milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import cli
from pipeline.settings import PER_PARTITION, PER_PROCESS
from tools.bench import backlog


def _run(partitions: int, mode: str, round_: int, rate: float | None) -> backlog.RunResult:
    return backlog.RunResult(partitions, mode, round_, rate=rate)


def test_the_ratio_is_the_largest_partition_count_over_the_smallest_with_its_target() -> None:
    results = [
        _run(3, PER_PROCESS, 1, 100.0),
        _run(384, PER_PROCESS, 1, 95.0),
        _run(3, PER_PROCESS, 2, 120.0),
        _run(384, PER_PROCESS, 2, 90.0),
        _run(48, PER_PROCESS, 1, 10.0),  # neither end: not in the ratio
        _run(3, PER_PARTITION, 1, 100.0),
        _run(384, PER_PARTITION, 1, 60.0),
        _run(384, PER_PARTITION, 2, None),  # a failed run counts in no median
    ]
    lines = backlog.ratios(results, [3, 48, 384], [PER_PROCESS, PER_PARTITION])
    # medians 92.5 / 110 = 0.84; per round 0.95 and 0.75 -> 0.85
    assert lines[0] == f"{PER_PROCESS}: 384 / 3 partitions = 0.84 (target >= 0.9: NOT met); per round 0.85"
    assert lines[1] == f"{PER_PARTITION}: 384 / 3 partitions = 0.60 (target >= 0.7: NOT met); per round 0.60"
    met = backlog.ratios([_run(3, PER_PROCESS, 1, 100.0), _run(384, PER_PROCESS, 1, 90.0)], [3, 384], [PER_PROCESS])
    assert met == [f"{PER_PROCESS}: 384 / 3 partitions = 0.90 (target >= 0.9: met); per round 0.90"]
    postgres = backlog.ratios([_run(3, "postgres", 1, 10.0), _run(384, "postgres", 1, 20.0)], [3, 384], ["postgres"])
    assert postgres == ["postgres: 384 / 3 partitions = 2.00; per round 2.00"]


def test_pipeline_bench_partitions_runs_the_backlog_bench_from_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(backlog, "main", lambda argv: seen.append(argv) or 0)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert cli.main(["bench", "partitions", "--repeat", "1"]) == 0
    assert seen == [["--repeat", "1"]]


def test_pipeline_bench_elsewhere_or_unknown_says_what_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # not a checkout: no tools/bench here
    assert cli.main(["bench", "partitions"]) == 2
    assert "from a checkout of the repository" in capsys.readouterr().err
    assert cli.main(["bench", "nonsense"]) == 2
    assert "one of partitions" in capsys.readouterr().err
