"""`pipeline run --workers 2` on a real broker: a worker killed by SIGKILL is restarted in its slot, SIGTERM to the
supervisor stops both cleanly (exit 0), and the checker finds the run exactly-once."""

from __future__ import annotations

import os
import re
import signal
import time

from confluent_kafka.admin import AdminClient

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
    fleet = run.start(0)
    fleet.run_args = ("--workers", "2")
    (supervisor,) = fleet.start(1)
    eventually(lambda: len(worker_pids(supervisor)) == 2, 30)
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
