"""What the fast failure detector (FAILURE_DETECTION_MS) did in a fault run, and whether it was right each time.

A detector removes a peer it has not heard from for longer than its bound. That is right when the peer was killed or
paused (SIGSTOP) within the bound before the removal; otherwise the peer was alive and only slow to beat (a loaded
machine, a long GC pause): a false positive. A false positive costs a rebalance and a restore, never exactly once
(docs/guarantees.md: fast-failure-detection), so the fault runs do not fail on it; the soak counts them, which is how
the bound's false-positive rate under load is measured (BENCHMARKS.md).

Both sides come from what a run keeps anyway: the removals from the instances' logs (every surviving peer that sees
the silence acts, so one death may be removed by several: counted once), the kills and pauses from the signals the
harness sent (`Instance.signals`). A removed member is named by its member id, which librdkafka starts with the
client id: the harness gives each instance its name as client id. A member id that names no instance (under
GROUP_PROTOCOL=consumer the broker's ids are opaque) is counted apart, as unknown.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.testing.harness import Instance

SILENT = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) WARNING .*pipeline\.kafka\.liveness: "
    r"member (?P<member>\S+) \(\S+\) silent for over (?P<bound>\d+) ms"
)
SAME_DEATH_S = 5.0  # removals of one member this close together are the peers acting on one silence
SLACK_S = 1.0  # a signal is logged by the harness just before it is sent; the detector's clock reads a beat later


@dataclass(frozen=True)
class Removal:
    at: float  # wall clock, seconds
    member: str
    bound_s: float
    by: str  # the instance whose detector acted


@dataclass(frozen=True)
class Judged:
    removal: Removal
    victim: str | None  # the instance the member id names; None: unknown
    cause: str  # "killed", "stopped" (SIGTERM), "paused", "false positive" or "unknown member"


def removals(logs: Iterable[tuple[str, Path]]) -> list[Removal]:
    """Every removal the detectors logged, one per silence (the first peer to act), in time order."""
    found = []
    for name, path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if match := SILENT.match(line):
                at = time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1000
                found.append(Removal(at, match["member"], int(match["bound"]) / 1000, name))
    found.sort(key=lambda r: r.at)
    first: list[Removal] = []
    for removal in found:
        if not any(r.member == removal.member and removal.at - r.at < SAME_DEATH_S for r in first):
            first.append(removal)
    return first


def judge(removal: Removal, instances: Sequence[Instance]) -> Judged:
    """Why the removed member was silent, from the signals its instance got up to the removal."""
    victim = next((i for i in instances if removal.member.startswith(f"{i.name}-")), None)
    if victim is None:
        return Judged(removal, None, "unknown member")
    window_start = removal.at - removal.bound_s - SLACK_S
    stopped_since: float | None = None
    for at, name in victim.signals:
        if at > removal.at + SLACK_S:
            break
        if name == "SIGKILL":
            return Judged(removal, victim.name, "killed")
        if name == "SIGTERM":
            return Judged(removal, victim.name, "stopped")
        if name == "SIGSTOP":
            stopped_since = at
        elif name == "SIGCONT" and stopped_since is not None:
            if at >= window_start:  # resumed within the bound before the removal: still silent from the pause
                return Judged(removal, victim.name, "paused")
            stopped_since = None
    cause = "paused" if stopped_since is not None else "false positive"
    return Judged(removal, victim.name, cause)


def summary(judged: Sequence[Judged]) -> str:
    """One line for a run's report: the removals by cause, and when each false positive struck."""
    if not judged:
        return "failure detection: no member removed"
    causes = Counter(j.cause for j in judged)
    bound_ms = round(judged[0].removal.bound_s * 1000)
    line = f"failure detection ({bound_ms} ms): {len(judged)} removals: " + ", ".join(
        f"{cause} {count}" for cause, count in sorted(causes.items())
    )
    wrong = [j for j in judged if j.cause == "false positive"]
    if wrong:
        line += "; false positives: " + ", ".join(
            f"{j.victim} at {time.strftime('%H:%M:%S', time.localtime(j.removal.at))} (by {j.removal.by})"
            for j in wrong
        )
    return line
