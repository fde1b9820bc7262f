"""The soak's growth verdict (pipeline/testing/soak.py) on synthetic series, and its /proc sampling: no broker."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

from pipeline.testing.faults import Outcome
from pipeline.testing.harness import Fleet, Instance, exited_by_themselves
from pipeline.testing.oracle import Verdict
from pipeline.testing.soak import (
    MIB,
    GrowthRule,
    Sample,
    Sampler,
    Series,
    SoakResult,
    growth_verdict,
    judge,
    read_process,
    report,
    write_samples,
)

EVERY_S = 5


Level = Callable[[float], float]


def series(name: str, minutes: float, rss_mib: Level, fds: Level, seed: int = 1) -> Series:
    """A sample every 5 s for `minutes`; rss_mib(t) and fds(t) give the level at t seconds, plus noise."""
    rng = random.Random(seed)
    samples = [
        Sample(t, int((rss_mib(t) + rng.gauss(0, 2)) * MIB), max(0, round(fds(t) + rng.gauss(0, 2))))
        for t in range(0, int(minutes * 60) + 1, EVERY_S)
    ]
    return Series(name, samples)


def flat_with_noise_and_spikes(t: float) -> float:
    # A warm-up in the first two minutes, then flat; a restore or a rebalance now and then doubles RSS briefly.
    return (60 + 30 * min(t, 120) / 120) * (2 if t % 300 < 15 else 1)


def test_a_flat_series_with_noise_spikes_and_a_warm_up_is_not_growth() -> None:
    growth = judge(series("instance-1", 31, flat_with_noise_and_spikes, lambda t: 40 + 20 * (t % 600 < 10)))
    assert growth.judged and growth.ok, growth.problems


def test_a_memory_leak_of_one_and_a_half_mib_a_minute_is_detected() -> None:
    growth = judge(series("instance-1", 31, lambda t: 90 + 1.5 * t / 60, lambda t: 40))
    assert growth.judged
    assert len(growth.problems) == 1 and "RSS grew" in growth.problems[0], growth.problems


def test_a_file_descriptor_leak_of_one_per_minute_is_detected() -> None:
    growth = judge(series("instance-1", 31, lambda t: 90, lambda t: 40 + t // 60))
    assert len(growth.problems) == 1 and "file descriptors grew" in growth.problems[0], growth.problems


def test_growth_that_stopped_in_the_first_minutes_is_not_a_leak() -> None:
    # The heap settles (state, caches filled) during minute 2: the baseline starts at minute 3 for that reason.
    growth = judge(series("instance-1", 31, lambda t: 50 + 100 * min(t, 150) / 150, lambda t: 30 + min(t, 150) // 10))
    assert growth.ok, growth.problems


def test_short_lived_instances_are_not_judged_and_a_soak_judging_none_fails() -> None:
    short = {
        f"instance-{n}": series(f"instance-{n}", 12, lambda t: 90 + 5 * t, lambda t: 40, seed=n) for n in range(2, 5)
    }
    growths, problems = growth_verdict(short)
    assert [g.judged for g in growths] == [False] * 3
    assert problems == ["no instance lived 20 minutes: nothing could be judged"]

    long_lived = series("instance-1", 31, flat_with_noise_and_spikes, lambda t: 40)
    growths, problems = growth_verdict({"instance-1": long_lived, **short})
    assert [g.judged for g in growths] == [True, False, False, False] and problems == []


def test_the_tolerance_is_the_larger_of_the_slack_and_the_fraction() -> None:
    big = series("instance-1", 31, lambda t: 400 if t < 900 else 450, lambda t: 40)  # +50 MiB on 400: 12.5 %
    assert judge(big).ok
    assert not judge(big, GrowthRule(rss_fraction=0.05)).ok


def test_read_process_reads_rss_and_fds_of_a_living_process_and_none_once_it_is_gone() -> None:
    rss, fds = read_process(os.getpid())
    assert rss > 10 * MIB and fds >= 3
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_process(child.pid) is None


def test_the_sampler_keeps_one_series_per_instance_lifetime(tmp_path) -> None:
    fleet = Fleet("unused:app", "127.0.0.1:1", {}, tmp_path)
    fleet.instances += [_sleeping(fleet, "instance-1"), _sleeping(fleet, "instance-2")]
    sampler = Sampler(fleet)
    sampler.sample_once()
    fleet.instances[1].kill()
    fleet.instances.append(_sleeping(fleet, "instance-3"))
    sampler.sample_once()
    for instance in fleet.instances:
        instance.kill()
    assert {name: len(s.samples) for name, s in sampler.series.items()} == {
        "instance-1": 2,
        "instance-2": 1,
        "instance-3": 1,
    }
    assert sampler.series["instance-3"].samples[0].at_s == 0


def test_an_instance_gone_without_a_kill_or_stop_from_the_harness_fails_the_soak(tmp_path) -> None:
    fleet = Fleet("unused:app", "127.0.0.1:1", {}, tmp_path)
    killed, stopped, crashed, alive = (_sleeping(fleet, f"instance-{n}") for n in range(1, 5))
    killed.kill()
    stopped.terminate()
    crashed.process.kill()  # not through the harness: as a process that exits by itself
    crashed.process.wait(10)
    crashed.log_path.write_text("pipeline run: Kafka error: fenced\n")
    try:
        assert exited_by_themselves([killed, stopped, crashed, alive]) == [
            "instance-3 exited by itself (code -9): pipeline run: Kafka error: fenced"
        ]
    finally:
        alive.kill()


def test_an_exit_the_test_waited_for_is_not_a_crash(tmp_path) -> None:
    # A start refused by design (a missing ACL: exit 2), which the test waits for and checks.
    refused = Instance(
        "instance-1", subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"]), tmp_path / "1.log"
    )
    assert refused.wait_for_exit(30) == 2
    assert exited_by_themselves([refused]) == []


def _sleeping(fleet: Fleet, name: str) -> Instance:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return Instance(name, process, fleet.log_dir / f"{name}.log")


def test_the_report_and_the_samples_file_say_what_was_judged_even_without_a_checker_verdict(tmp_path) -> None:
    leaking = series("instance-1", 31, lambda t: 90 + 1.5 * t / 60, lambda t: 40)
    short = series("instance-2", 5, lambda t: 90, lambda t: 40)
    growths, problems = growth_verdict({"instance-1": leaking, "instance-2": short})
    result = SoakResult(
        None,
        growths,
        ["the checker could not run: TimeoutError()", *problems],
        Counter(sigkill=16, zombie=15),
        1_000_000,
        1860.0,
        (1.0, 2.0, 3.0),
        (4.0, 5.0, 6.0),
    )
    text = report(result)
    assert text.startswith("soak FAIL: 1000000 records over 31.0 min, 31 faults (sigkill 16, zombie 15)")
    assert "checker: did not run" in text and "instance-1: RSS grew" in text
    assert "instance-2" in text.split("RSS grew")[0]  # listed, not judged
    write_samples({"instance-1": leaking, "instance-2": short}, tmp_path / "run" / "soak-samples.csv")
    lines = (tmp_path / "run" / "soak-samples.csv").read_text().splitlines()
    assert lines[0] == "instance,at_s,rss_bytes,fds" and len(lines) == 1 + len(leaking.samples) + len(short.samples)


def test_a_crash_the_checker_did_not_see_fails_the_soak_and_is_reported_once() -> None:
    exited = "instance-2 exited by itself (code 1): pipeline run: Kafka error: fenced"
    clean = Verdict(inputs=100, outputs=100, dead_letters=0, changelog_records=0)
    result = SoakResult(
        Outcome(clean, {}, [], "", [exited]), [], [exited], Counter(sigkill=1), 100, 60.0, (1.0,) * 3, (1.0,) * 3
    )
    text = report(result)
    assert text.startswith("soak FAIL") and "checker OK: 100 in, 100 out" in text
    assert text.count(exited) == 1
