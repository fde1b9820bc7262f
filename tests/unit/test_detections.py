"""The soak's count of the fast failure detector's removals: each judged killed, paused or a false positive."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from pipeline.testing import detections
from pipeline.testing.harness import Instance

T0 = time.mktime(time.strptime("2026-11-25 18:34:00", "%Y-%m-%d %H:%M:%S"))


def silent_line(seconds: float, member: str, bound_ms: int = 500) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0 + int(seconds)))
    return (
        f"{stamp},{round(seconds % 1 * 1000):03d} WARNING [7749] pipeline.kafka.liveness: member {member} (dynamic) "
        f"silent for over {bound_ms} ms: fencing its producer and removing it from the group"
    )


def instance(name: str, tmp_path: Path, signals: Sequence[tuple[float, str]] = ()) -> Instance:
    process = cast(subprocess.Popen[bytes], None)  # judging reads names and signals only
    return Instance(name, process, tmp_path / f"{name}.log", [(T0 + at, sig) for at, sig in signals])


def judged(tmp_path: Path, logs: dict[str, list[str]], fleet: list[Instance]) -> list[detections.Judged]:
    for name, lines in logs.items():
        (tmp_path / f"{name}.log").write_text("\n".join(["2026-11-25 18:33:59,000 INFO [1] x: start", *lines]))
    found = detections.removals((name, tmp_path / f"{name}.log") for name in logs)
    return [detections.judge(removal, fleet) for removal in found]


def test_a_killed_peer_removed_by_both_survivors_counts_once(tmp_path: Path) -> None:
    fleet = [instance("instance-1", tmp_path), instance("instance-2", tmp_path, [(2.0, "SIGKILL")])]
    logs = {
        "instance-1": [silent_line(2.9, "instance-2-c8c23c72")],
        "instance-3": [silent_line(3.0, "instance-2-c8c23c72")],
    }
    [one] = judged(tmp_path, logs, fleet)
    assert (one.victim, one.cause, one.removal.by) == ("instance-2", "killed", "instance-1")


def test_removed_during_or_just_after_a_pause_is_a_paused_peer(tmp_path: Path) -> None:
    fleet = [
        instance("instance-2", tmp_path, [(1.0, "SIGSTOP")]),  # still stopped at the removal
        instance("instance-12", tmp_path, [(10.0, "SIGSTOP"), (13.0, "SIGCONT")]),  # resumed just before
    ]
    logs = {"instance-1": [silent_line(2.0, "instance-2-aa"), silent_line(13.4, "instance-12-bb")]}
    assert [(j.victim, j.cause) for j in judged(tmp_path, logs, fleet)] == [
        ("instance-2", "paused"),
        ("instance-12", "paused"),  # instance-12's name starts with "instance-1": the dash tells them apart
    ]


def test_a_live_peer_removed_is_a_false_positive(tmp_path: Path) -> None:
    fleet = [
        instance("instance-2", tmp_path, [(1.0, "SIGSTOP"), (4.0, "SIGCONT")]),  # long resumed at 30 s
        instance("instance-3", tmp_path, [(50.0, "SIGKILL")]),  # killed after the removal
    ]
    logs = {"instance-1": [silent_line(30.0, "instance-2-aa"), silent_line(40.0, "instance-3-bb")]}
    result = judged(tmp_path, logs, fleet)
    assert [j.cause for j in result] == ["false positive", "false positive"]
    assert detections.summary(result).startswith("failure detection (500 ms): 2 removals: false positive 2; ")
    assert "instance-2 at " in detections.summary(result) and "(by instance-1)" in detections.summary(result)


def test_a_stopping_peer_and_an_unknown_member_id_are_named_as_such(tmp_path: Path) -> None:
    fleet = [instance("instance-2", tmp_path, [(1.0, "SIGTERM")])]
    logs = {"instance-1": [silent_line(2.0, "instance-2-aa"), silent_line(9.0, "Zx0aPQ")]}
    assert [j.cause for j in judged(tmp_path, logs, fleet)] == ["stopped", "unknown member"]
    assert detections.summary([]) == "failure detection: no member removed"
