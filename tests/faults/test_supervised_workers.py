"""`pipeline run --workers 2` on a real broker: a worker killed by SIGKILL is restarted in its slot, SIGTERM to the
supervisor stops both cleanly (exit 0), and the checker finds the run exactly-once."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request

from confluent_kafka.admin import AdminClient

from pipeline.testing import inputs
from pipeline.testing.faults import FaultRun
from pipeline.testing.harness import Fleet, Instance
from tests.faults.conftest import PARTITIONS, assert_exactly_once
from tests.support import eventually

TOTALS = "pipeline.examples.running_totals:app"
SLOW_START = "tests.faults.slow_start:app"
STARTED = re.compile(r"worker (\d+) started: pid (\d+)")


def worker_pids(supervisor: Instance) -> dict[int, int]:
    """Slot -> pid of the worker last started in it, from the supervisor's log."""
    return {int(slot): int(pid) for slot, pid in STARTED.findall(supervisor.log_path.read_text(errors="replace"))}


def start_supervisor(run: FaultRun) -> tuple[Fleet, Instance]:
    """One `pipeline run --workers 2`, returned once it started both workers."""
    fleet = run.start(0)
    fleet.run_args = ("--workers", "2")
    (supervisor,) = fleet.start(1)
    eventually(lambda: len(worker_pids(supervisor)) == 2, 30)
    return fleet, supervisor


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def members(bootstrap: str, group: str) -> dict[str, tuple[str, list[int]]]:
    """group.instance.id -> (member id, input partitions), for every member of the group now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(10)
    return {
        m.group_instance_id: (m.member_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
        for m in description.members
    }


def rejoined(bootstrap: str, group: str, instance_id: str, old_member_id: str) -> bool:
    """A new member under `instance_id` (not the killed one, which the group lists until its session ends) owns
    partitions, and so does every other member."""
    now = members(bootstrap, group)
    return instance_id in now and now[instance_id][0] != old_member_id and all(parts for _, parts in now.values())


def test_a_killed_worker_restarts_and_sigterm_stops_all_cleanly(fault_run):
    # Static members: two workers with one GROUP_INSTANCE_ID would fence each other; each gets its own (-w0, -w1).
    run = fault_run(TOTALS, group_instance_id="totals-host")
    run.feed(list(inputs.running_totals_records(20_000, partitions=PARTITIONS, seed=11)), seconds=8)
    fleet, supervisor = start_supervisor(run)
    first = worker_pids(supervisor)
    time.sleep(3)  # mid-stream: the victim has transactions open
    eventually(lambda: len(members(run.bootstrap, run.app_id)) == 2, 30, 0.2)
    before = members(run.bootstrap, run.app_id)
    assert sorted(before) == ["totals-host-w0", "totals-host-w1"]
    os.kill(first[1], signal.SIGKILL)
    eventually(lambda: worker_pids(supervisor)[1] != first[1], 30)
    # Restarted means a member again, under its slot's id, with partitions of its own.
    eventually(lambda: rejoined(run.bootstrap, run.app_id, "totals-host-w1", before["totals-host-w1"][0]), 30, 0.5)
    outcome = run.finish()  # caught up, then SIGTERM to the supervisor
    log = supervisor.log_path.read_text(errors="replace")
    assert supervisor.process.returncode == 0, fleet.logs()
    assert f"worker 1 (pid {first[1]}) killed by SIGKILL" in log
    assert not any(alive(pid) for pid in worker_pids(supervisor).values())
    assert "all 2 workers stopped" in log
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 20_000


def test_with_fast_detection_a_restarted_worker_takes_its_slot_back_without_a_rebalance(fault_run):
    """FAILURE_DETECTION_MS on, a worker SIGKILLed and restarted at once under its static id: its peer hears that the
    supervisor restarts it before the old one's silence reaches the bound, so it neither fences the producer (the
    new incarnation's own fence aborts what the old one left open) nor removes the member (the new one takes the
    static id's place). The peer's partitions stay where they are: no "revoked" and no "assigned" in its log after
    the kill (a removal would hand it the dead worker's partitions, then take them back). The App's import takes 2.5 s
    (tests/faults/slow_start.py): the new worker beats later than the bound, so only the supervisor's announcement
    can keep the slot."""
    # A 30 s session: however slowly the new worker starts, nothing but the detector could move partitions meanwhile.
    run = fault_run(
        SLOW_START, group_instance_id="totals-host", failure_detection_ms="1500", session_timeout_ms="30000"
    )
    run.feed(list(inputs.running_totals_records(20_000, partitions=PARTITIONS, seed=12)), seconds=8)
    _, supervisor = start_supervisor(run)
    first = worker_pids(supervisor)
    eventually(lambda: len(members(run.bootstrap, run.app_id)) == 2, 30, 0.2)
    before = members(run.bootstrap, run.app_id)
    eventually(lambda: all(parts for _, parts in members(run.bootstrap, run.app_id).values()), 30, 0.2)
    time.sleep(3)  # mid-stream, settled: the victim has transactions open
    logged_before_kill = len(supervisor.log_path.read_bytes())
    os.kill(first[1], signal.SIGKILL)
    eventually(lambda: worker_pids(supervisor)[1] != first[1], 30)
    eventually(lambda: rejoined(run.bootstrap, run.app_id, "totals-host-w1", before["totals-host-w1"][0]), 30, 0.2)
    # From the kill until the new worker owns its partitions (the stop at the end moves partitions too).
    until_back = supervisor.log_path.read_bytes()[logged_before_kill:].decode(errors="replace")
    outcome = run.finish()
    peer = [line for line in until_back.splitlines() if f"[{first[0]}]" in line]
    moved = [line for line in peer if " revoked [" in line or " assigned [" in line or "removed from group" in line]
    assert not moved, "\n".join(moved)
    assert "told the peers of totals-host-w1 that it is restarting" in until_back
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 20_000


def status(port: int, path: str = "/live") -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return 0  # not served yet


def test_the_supervisors_live_is_503_while_a_workers_loop_is_stuck(fault_run):
    """`/live` of `--workers 2` (the one endpoint an orchestrator probes) follows every worker's poll loop: 503 while
    one worker is stopped (SIGSTOP: a loop that does not turn) past LIVE_TIMEOUT_MS, 200 again once it turns; the
    run stays exactly once. LIVE_TIMEOUT_MS must exceed the longest healthy turn: short time-outs keep it at 21 s."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeouts = {"transaction_timeout_ms": "4000", "request_timeout_ms": "4000", "live_timeout_ms": "21000"}
    run = fault_run(TOTALS, group_instance_id="totals-host", metrics_port=str(port), **timeouts)
    run.feed(list(inputs.running_totals_records(10_000, partitions=PARTITIONS, seed=13)), seconds=10)
    _, supervisor = start_supervisor(run)
    eventually(lambda: status(port, "/ready") == 200, 60, 0.5)  # both workers' loops turn (before: not judged)
    assert status(port) == 200
    stuck = worker_pids(supervisor)[1]
    os.kill(stuck, signal.SIGSTOP)
    try:
        eventually(lambda: status(port) == 503, 40, 0.5)
    finally:
        os.kill(stuck, signal.SIGCONT)
    eventually(lambda: status(port) == 200, 30, 0.5)
    outcome = run.finish()
    assert worker_pids(supervisor)[1] == stuck  # stuck, not dead: nobody restarted it
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 10_000
