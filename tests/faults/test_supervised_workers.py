"""`pipeline run --workers 2` on a real broker: a worker killed by SIGKILL is restarted in its slot, SIGTERM to the
supervisor stops both cleanly (exit 0), and the checker finds the run exactly-once."""

from __future__ import annotations

import os
import re
import signal
import time

from pipeline.testing import inputs
from pipeline.testing.harness import Instance
from tests.faults.conftest import PARTITIONS, assert_exactly_once
from tests.support import eventually

TOTALS = "pipeline.examples.running_totals:app"
STARTED = re.compile(r"worker (\d+) started: pid (\d+)")


def worker_pids(supervisor: Instance) -> dict[int, int]:
    """Slot -> pid of the worker last started in it, from the supervisor's log."""
    return {int(slot): int(pid) for slot, pid in STARTED.findall(supervisor.log_path.read_text(errors="replace"))}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_killed_worker_restarts_and_sigterm_stops_all_cleanly(fault_run):
    # Static members: two workers with one GROUP_INSTANCE_ID would fence each other; each gets its own (-w0, -w1).
    run = fault_run(TOTALS, group_instance_id="totals-host")
    run.feed(list(inputs.running_totals_records(20_000, partitions=PARTITIONS, seed=11)), seconds=8)
    fleet = run.start(0)
    fleet.run_args = ("--workers", "2")
    (supervisor,) = fleet.start(1)
    eventually(lambda: len(worker_pids(supervisor)) == 2, 30)
    first = worker_pids(supervisor)
    time.sleep(3)  # mid-stream: the victim has transactions open
    os.kill(first[1], signal.SIGKILL)
    eventually(lambda: worker_pids(supervisor)[1] != first[1], 30)
    outcome = run.finish()  # caught up, then SIGTERM to the supervisor
    log = supervisor.log_path.read_text(errors="replace")
    assert supervisor.process.returncode == 0, fleet.logs()
    assert f"worker 1 (pid {first[1]}) killed by SIGKILL" in log
    assert not any(alive(pid) for pid in worker_pids(supervisor).values())
    assert "all 2 workers stopped" in log
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 20_000
