"""`pipeline chaos MODULE:ATTR --profile soak`: a long run with a fault every minute that fails on resource growth.

One run on fresh topics (pipeline/testing/faults.py's FaultRun): the input (by default 1,000,000 records) is fed
evenly over the run (by default 30 minutes), N instances process it, and every `fault_every_s` the next process
fault of a fixed rotation strikes. Every few seconds the resident memory (RSS) and the open file descriptors of
each living instance are read from /proc. The verdict fails if the checker finds a problem, a fault could not be
injected, or an instance's RSS or file descriptors grew.

Growth, robustly (a leak is slow and steady; noise, a rebalance or a restore are not): per instance lifetime (a
restarted instance is a new series), the median of its last `recent_s` (10 minutes) against the median of its
minutes 3 to 10 (the baseline, once start-up, the first restore and the allocator's warm-up are over). It grew if
the later median exceeds the baseline by more than the tolerance: max(an absolute slack, a fraction of the
baseline). Medians over minutes shrug off spikes (a restore, a paused instance, a burst of sockets in a rebalance).
Only instances that lived long enough for both windows not to overlap are judged, and the soak keeps one instance
("spared") alive for the whole run so there always is one: the kill faults (SIGKILL, SIGTERM, scale-in) pick their
victims among the others, the pause faults (SIGSTOP past the session and transaction time-outs: fenced, dropped,
taken over again) among all. So the spared instance lives through every rebalance, revocation, restore and fencing
of the run, which is where a leak would hide. A soak in which no instance could be judged fails.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pipeline.app import App
from pipeline.testing import detections, faults
from pipeline.testing.harness import Fleet, Instance, exited_by_themselves

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024
# The process faults that strike a running fleet (faults.FAULTS; "none" and "aborts" are not injections).
ROTATION = ("sigkill", "sigterm", "pause-short", "zombie", "zombie-long", "scale")
PAUSES = frozenset({"pause-short", "zombie", "zombie-long"})  # these may hit the spared instance too


# -- sampling ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    at_s: float  # seconds since the instance was first sampled
    rss_bytes: int
    fds: int


def read_process(pid: int) -> tuple[int, int] | None:
    """(RSS in bytes, open file descriptors) of a living process from /proc; None once it is gone (or a zombie
    waiting to be reaped, whose RSS reads 0)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return (resident_pages * PAGE_SIZE, fds) if resident_pages else None


@dataclass
class Series:
    """One instance lifetime's samples."""

    name: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def lifetime_s(self) -> float:
        return self.samples[-1].at_s if self.samples else 0.0


class Sampler:
    """Samples every living instance of a fleet every `every_s` seconds, in a background thread."""

    def __init__(self, fleet: Fleet, every_s: float = 5.0) -> None:
        self.fleet, self.every_s = fleet, every_s
        self.series: dict[str, Series] = {}
        self._first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Series]:
        self._stop.set()
        self._thread.join(30)
        return self.series

    def sample_once(self) -> None:
        now = time.monotonic()
        for instance in list(self.fleet.instances):
            reading = read_process(instance.process.pid) if instance.alive else None
            if reading is None:
                continue
            first = self._first_seen.setdefault(instance.name, now)
            series = self.series.setdefault(instance.name, Series(instance.name))
            series.samples.append(Sample(now - first, *reading))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.every_s)


# -- the growth verdict -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GrowthRule:
    baseline_from_s: float = 180.0  # minutes 3 ..
    baseline_to_s: float = 600.0  # .. 10 of the instance's life
    recent_s: float = 600.0  # against its last 10 minutes
    rss_slack_bytes: int = 24 * MIB
    rss_fraction: float = 0.15
    fd_slack: int = 12
    fd_fraction: float = 0.25

    @property
    def judged_after_s(self) -> float:
        """The shortest lifetime judged: the recent window starts after the baseline ended."""
        return self.baseline_to_s + self.recent_s


@dataclass(frozen=True)
class Growth:
    name: str
    judged: bool
    lifetime_s: float
    rss_first: int
    rss_last: int
    fds_first: int
    fds_last: int
    rss_baseline: float = 0.0
    rss_recent: float = 0.0
    fds_baseline: float = 0.0
    fds_recent: float = 0.0
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _median(samples: Sequence[Sample], attribute: str) -> float:
    return float(statistics.median(getattr(s, attribute) for s in samples))


class _Figures(TypedDict):  # what Growth reports of an instance, judged or not
    name: str
    lifetime_s: float
    rss_first: int
    rss_last: int
    fds_first: int
    fds_last: int


def judge(series: Series, rule: GrowthRule = GrowthRule()) -> Growth:
    samples = series.samples
    first, last = samples[0], samples[-1]
    figures = _Figures(
        name=series.name,
        lifetime_s=series.lifetime_s,
        rss_first=first.rss_bytes,
        rss_last=last.rss_bytes,
        fds_first=first.fds,
        fds_last=last.fds,
    )
    baseline = [s for s in samples if rule.baseline_from_s <= s.at_s <= rule.baseline_to_s]
    recent = [s for s in samples if s.at_s >= last.at_s - rule.recent_s]
    if series.lifetime_s < rule.judged_after_s or not baseline or not recent:
        return Growth(judged=False, **figures)
    rss_baseline, rss_recent = _median(baseline, "rss_bytes"), _median(recent, "rss_bytes")
    fds_baseline, fds_recent = _median(baseline, "fds"), _median(recent, "fds")
    problems = []
    rss_allowed = max(rule.rss_slack_bytes, rule.rss_fraction * rss_baseline)
    if rss_recent - rss_baseline > rss_allowed:
        problems.append(
            f"{series.name}: RSS grew from a median of {rss_baseline / MIB:.1f} MiB (minutes "
            f"{rule.baseline_from_s / 60:g}-{rule.baseline_to_s / 60:g}) to {rss_recent / MIB:.1f} MiB "
            f"(last {rule.recent_s / 60:g} minutes), more than the {rss_allowed / MIB:.1f} MiB allowed"
        )
    fds_allowed = max(rule.fd_slack, rule.fd_fraction * fds_baseline)
    if fds_recent - fds_baseline > fds_allowed:
        problems.append(
            f"{series.name}: open file descriptors grew from a median of {fds_baseline:g} to "
            f"{fds_recent:g}, more than the {fds_allowed:g} allowed"
        )
    return Growth(
        judged=True,
        rss_baseline=rss_baseline,
        rss_recent=rss_recent,
        fds_baseline=fds_baseline,
        fds_recent=fds_recent,
        problems=tuple(problems),
        **figures,
    )


def growth_verdict(series: dict[str, Series], rule: GrowthRule = GrowthRule()) -> tuple[list[Growth], list[str]]:
    """Every series judged (or not: too short), and the problems; none judged is a problem of its own."""
    growths = [judge(s, rule) for s in series.values() if s.samples]
    problems = [p for g in growths for p in g.problems]
    if not any(g.judged for g in growths):
        problems.append(f"no instance lived {rule.judged_after_s / 60:g} minutes: nothing could be judged")
    return growths, problems


# -- the soak run -----------------------------------------------------------------------------------------------------
@dataclass
class SoakProfile:
    records: int = 1_000_000  # fed evenly over `minutes`
    minutes: float = 30.0
    partitions: int = 6  # two per instance: the spared one keeps some through the rebalances
    instances: int = 3  # the spared one and two the kill faults may replace
    fault_every_s: float = 60.0
    sample_every_s: float = 5.0
    rotation: tuple[str, ...] = ROTATION


class SparedFleet:
    """The fleet as a kill fault sees it: every instance but the spared one (see the module's docstring)."""

    def __init__(self, fleet: Fleet, spared: Instance) -> None:
        self.fleet, self.spared = fleet, spared

    @property
    def alive(self) -> list[Instance]:
        return [i for i in self.fleet.alive if i is not self.spared]

    def start(self, count: int = 1) -> list[Instance]:
        return self.fleet.start(count)


@dataclass
class SoakResult:
    outcome: faults.Outcome | None  # None: the checker could not run (said in `problems`)
    growths: list[Growth]
    problems: list[str]  # growth, and faults that could not be injected
    faults: Counter[str]
    records: int
    seconds: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    # the fast failure detector's removals, each with its cause (a false positive does not fail the soak: it costs
    # a rebalance, not exactly once; counting them is how the bound is judged under load)
    removals: list[detections.Judged] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome is not None and self.outcome.ok and not self.problems


def strike(fleet: Fleet, profile: SoakProfile, rng: random.Random, started: float) -> tuple[Counter[str], list[str]]:
    """The next fault of the rotation every `fault_every_s` until the run's end; returns what struck and what
    could not."""
    spared = SparedFleet(fleet, fleet.instances[0])
    end = started + profile.minutes * 60
    struck: Counter[str] = Counter()
    errors: list[str] = []
    for number in itertools.count(1):
        moment = started + number * profile.fault_every_s
        if moment >= end:
            break
        time.sleep(max(0.0, moment - time.monotonic()))
        name = profile.rotation[(number - 1) % len(profile.rotation)]
        try:
            faults.FAULTS[name].inject(fleet if name in PAUSES else spared, rng)
            struck[name] += 1
        except Exception as e:  # a fault that fails is reported in the verdict, the soak goes on
            errors.append(f"fault {name} at {time.monotonic() - started:.0f} s failed: {e!r}")
    time.sleep(max(0.0, end - time.monotonic()))
    return struck, errors


def run_soak(
    app: App,
    app_spec: str,
    bootstrap: str,
    profile: SoakProfile,
    seed: int,
    log_dir: Path,
    rule: GrowthRule = GrowthRule(),
) -> SoakResult:
    records = faults.seed_records(
        app, faults.Profile(records=profile.records, partitions=profile.partitions), seed, None
    )
    run = faults.FaultRun(app, app_spec, bootstrap, profile.partitions, log_dir)
    load_before, started = os.getloadavg(), time.monotonic()
    sampler: Sampler | None = None
    try:
        run.feed(records, profile.minutes * 60)
        fleet = run.start(profile.instances)
        sampler = Sampler(fleet, profile.sample_every_s).start()
        struck, fault_errors = strike(fleet, profile, random.Random(f"{seed}-soak"), started)
        fault_errors += exited_by_themselves(fleet.instances)
        series = sampler.stop()  # before the fleet stops: its shutdown is not part of the soak
        load_after, seconds = os.getloadavg(), time.monotonic() - started
        write_samples(series, log_dir / run.app_id / "soak-samples.csv")
        try:  # the growth verdict is reported whatever happens to the checker
            outcome = run.finish(timeout_s=600)
        except Exception as e:  # e.g. a drain that did not reach the end in time
            outcome, fault_errors = None, [*fault_errors, f"the checker could not run: {e!r}"]
        removed = detections.removals((i.name, i.log_path) for i in fleet.instances)
        judged = [detections.judge(removal, fleet.instances) for removal in removed]
    finally:
        if sampler is not None:
            sampler.stop()
        run.abandon()
    growths, problems = growth_verdict(series, rule)
    problems = fault_errors + problems
    return SoakResult(outcome, growths, problems, struck, len(records), seconds, load_before, load_after, judged)


def write_samples(series: dict[str, Series], path: Path) -> None:
    """Every sample as CSV (instance, seconds into its life, RSS bytes, open fds): to plot or to judge again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        out.write("instance,at_s,rss_bytes,fds\n")
        for name, one in series.items():
            out.writelines(f"{name},{s.at_s:.1f},{s.rss_bytes},{s.fds}\n" for s in one.samples)


def report(result: SoakResult) -> str:
    outcome = result.outcome
    verdict = outcome.verdict if outcome else None
    faults = ", ".join(f"{name} {count}" for name, count in result.faults.items())
    if outcome is not None and verdict is not None:
        # The checker's own findings: an instance that exited by itself is one of the soak's problems, listed below.
        found = "OK" if verdict.ok and not outcome.phantoms else "FAIL"
        checked = (
            f"checker {found}: {verdict.inputs} in, {verdict.outputs} out, "
            f"{verdict.duplicates.count} duplicates, {verdict.losses.count} lost, {verdict.state.count} state, "
            f"{len(outcome.phantoms)} phantom reads"
        )
    else:
        checked = f"checker: STUCK, lag per partition {outcome.stuck}" if outcome else "checker: did not run"
    lines = [
        f"soak {'OK' if result.ok else 'FAIL'}: {result.records} records over {result.seconds / 60:.1f} min, "
        f"{sum(result.faults.values())} faults ({faults}); load average "
        f"{' '.join(f'{x:.2f}' for x in result.load_before)} -> {' '.join(f'{x:.2f}' for x in result.load_after)}",
        checked,
        detections.summary(result.removals),
        f"{'instance':<12} {'lived':>6} {'judged':>6} {'RSS MiB first/base/recent/last':>31} "
        f"{'fds first/base/recent/last':>27}",
    ]
    for g in result.growths:
        rss = "/".join(f"{x / MIB:.0f}" if x else "-" for x in (g.rss_first, g.rss_baseline, g.rss_recent, g.rss_last))
        fds = "/".join(f"{x:g}" if x else "-" for x in (g.fds_first, g.fds_baseline, g.fds_recent, g.fds_last))
        lines.append(f"{g.name:<12} {g.lifetime_s / 60:>5.1f}m {'yes' if g.judged else 'no':>6} {rss:>31} {fds:>27}")
    return "\n".join(lines + result.problems)


def main(app: App, app_spec: str, bootstrap: str, seed: int, log_dir: Path, profile: SoakProfile) -> int:
    print(
        f"[soak] {profile.records} records over {profile.minutes:g} min, a fault every "
        f"{profile.fault_every_s:g} s ({', '.join(profile.rotation)}), {profile.instances} instances",
        flush=True,
    )
    result = run_soak(app, app_spec, bootstrap, profile, seed, log_dir)
    if result.outcome is not None and not result.outcome.ok:
        print(result.outcome.logs[-4000:], file=sys.stderr)
    print(report(result))
    return 0 if result.ok else 1
