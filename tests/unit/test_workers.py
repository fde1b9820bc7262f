"""`pipeline run --workers N` (pipeline/supervisor.py) without a broker: the restart policy on fake processes and a fake
clock, each worker's environment and command, the merged metrics and /ready, and real child processes killed and
stopped by real signals."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pipeline.cli import _parser
from pipeline.settings import ConfigError
from pipeline.settings import load as load_settings
from pipeline.supervisor import (
    CONFIG_ERROR_EXIT,
    InstanceIdsTaken,
    Slot,
    Supervisor,
    WorkerMetrics,
    WorkerSpec,
    _wait_stopped,
    describe_exit,
    instance_ids_lock,
    restart_delay,
    supervise,
    worker_command,
    worker_env,
    worker_settings,
)
from pipeline.worker_identity import to_a_worker
from tests.fakes import FakeClock
from tests.support import eventually


class FakeProcess:
    pids = iter(range(1000, 10_000))

    def __init__(self, command: list[str], env: dict[str, str], payload: bytes = b"") -> None:
        self.pid = next(FakeProcess.pids)
        self.command, self.env, self.payload = command, env, payload
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def supervised(count: int = 2) -> tuple[Supervisor, FakeClock, list[FakeProcess]]:
    clock, spawned = FakeClock(0.0), []

    def spawn(command: list[str], env: dict[str, str], payload: bytes) -> FakeProcess:
        spawned.append(FakeProcess(command, env, payload))
        return spawned[-1]

    supervisor = Supervisor(
        count, ["worker"], lambda slot: {"PIPELINE_WORKER_SLOT": str(slot)}, spawn=spawn, clock=clock
    )
    supervisor.start()
    return supervisor, clock, spawned


def test_restart_delay_is_none_after_a_crash_then_doubles_up_to_the_cap() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]


def test_a_crashed_worker_restarts_in_its_slot_at_once_then_after_a_back_off_if_it_keeps_failing() -> None:
    supervisor, clock, spawned = supervised()
    assert [p.env["PIPELINE_WORKER_SLOT"] for p in spawned] == ["0", "1"]
    spawned[1].returncode = -signal.SIGKILL
    clock.now = 5.0
    assert supervisor.check() is None  # noticed and restarted in the same check: no wait after a crash
    assert len(spawned) == 3 and spawned[2].env["PIPELINE_WORKER_SLOT"] == "1" and supervisor.all_running()
    # It fails again right away: a worker that cannot start waits 1 s, then twice as long.
    spawned[2].returncode = 1
    clock.now = 6.0
    supervisor.check()
    clock.now = 6.9
    supervisor.check()
    assert len(spawned) == 3
    clock.now = 7.0
    supervisor.check()
    assert len(spawned) == 4
    spawned[3].returncode = 1
    clock.now = 7.5
    supervisor.check()
    clock.now = 9.4
    supervisor.check()
    assert len(spawned) == 4
    clock.now = 9.5
    supervisor.check()
    assert len(spawned) == 5
    spawned[4].returncode = 0  # even a clean exit nobody asked for: the supervisor keeps N members
    clock.now = 70.0  # after a minute of running, the back-off is reset: at once again
    supervisor.check()
    assert len(spawned) == 6 and spawned[5].env["PIPELINE_WORKER_SLOT"] == "1"


def test_a_configuration_error_stops_everything_instead_of_restarting() -> None:
    supervisor, _, spawned = supervised()
    spawned[0].returncode = CONFIG_ERROR_EXIT
    assert supervisor.check() == CONFIG_ERROR_EXIT
    assert len(spawned) == 2


def test_stop_terminates_every_worker_and_cancels_pending_restarts() -> None:
    supervisor, clock, spawned = supervised(3)
    spawned[2].returncode = -signal.SIGKILL
    supervisor.check()  # restarted at once
    spawned[3].returncode = 1
    supervisor.check()  # failed again at once: a restart pending after 1 s
    supervisor.stop()
    assert [p.signals for p in spawned] == [[signal.SIGTERM], [signal.SIGTERM], [], []]
    spawned[0].returncode = 0
    spawned[1].returncode = -signal.SIGTERM  # stopped before it had installed its handlers: it owned nothing
    clock.now = 100.0
    supervisor.check()
    assert supervisor.running() == [] and len(spawned) == 4 and supervisor.unclean == []


def test_a_worker_failing_while_stopping_is_reported() -> None:
    supervisor, _, spawned = supervised()
    supervisor.stop()
    spawned[0].returncode, spawned[1].returncode = 0, 1
    supervisor.check()
    assert supervisor.unclean == ["worker 1: exited with code 1"]


def test_describe_exit() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


def test_each_worker_gets_its_slot_its_own_static_member_id_and_no_port() -> None:
    base = {"PATH": "/bin", "PIPELINE_METRICS_PORT": "9100", "prometheus_multiproc_dir": "/elsewhere"}
    env = worker_env(base, 1, "/tmp/m")
    assert env == {
        "PATH": "/bin",
        "PIPELINE_METRICS_PORT": "9100",  # the environment of the command line: its settings were parsed already
        "PIPELINE_WORKER_SLOT": "1",
        "PROMETHEUS_MULTIPROC_DIR": "/tmp/m",
    }
    settings = load_settings(None, {"PIPELINE_METRICS_PORT": "9100", "PIPELINE_GROUP_INSTANCE_ID": "host-a"})
    assert (worker_settings(settings, 1).metrics_port, worker_settings(settings, 1).group_instance_id) == (
        0,
        "host-a-w1",
    )
    # Static members by default: the host's name (a StatefulSet's pod name) and the slot.
    assert worker_settings(load_settings(None, {}), 0, host="node-3").group_instance_id == "node-3-w0"
    assert worker_settings(load_settings(None, {}), 1).group_instance_id == f"{socket.gethostname()}-w1"


def test_a_second_supervisor_of_the_group_with_the_same_ids_on_one_host_is_refused(tmp_path: Path) -> None:
    with instance_ids_lock("totals", "node-3", str(tmp_path)):
        with (
            pytest.raises(InstanceIdsTaken, match="GROUP_INSTANCE_ID"),
            instance_ids_lock("totals", "node-3", str(tmp_path)),
        ):
            pass
        with instance_ids_lock("totals", "node-4", str(tmp_path)), instance_ids_lock("other", "node-3", str(tmp_path)):
            pass  # another id, or another group: no conflict
    with instance_ids_lock("totals", "node-3", str(tmp_path)):
        pass  # released when the first supervisor ends


def test_a_worker_gets_the_settings_of_the_config_file_with_the_slot_and_the_port_overridden(tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text("metrics_port = 9100\ngroup_instance_id = 'pod-7'\n")
    settings = worker_settings(load_settings(config, {}), 3)
    assert (settings.metrics_port, settings.group_instance_id) == (0, "pod-7-w3")
    # PIPELINE_WORKER_SLOT (a worker's environment) is a known setting once pipeline.supervisor is loaded
    assert load_settings(config, {"PIPELINE_WORKER_SLOT": "3"}).metrics_port == 9100
    with pytest.raises(ConfigError, match="unknown setting PIPELINE_WORKER_SLOTS"):
        load_settings(None, {"PIPELINE_WORKER_SLOTS": "1"})


def test_a_worker_is_handed_the_parsed_settings_on_a_pipe_not_the_options_on_its_command_line() -> None:
    args = _parser().parse_args(
        [
            "--log-level",
            "debug",
            "run",
            "my.mod:app",
            "--workers",
            "4",
            "--metrics-port",
            "9100",
            "--app-id",
            "a",
            "--sink",
            "kafka",
        ]
    )
    command = worker_command(42)
    assert command[1:] == ["-m", "pipeline.worker", "--supervisor", "42"]
    settings = load_settings(None, {}, app_id=args.app_id, sink=args.sink, metrics_port=args.metrics_port)
    spec = pickle.loads(pickle.dumps(WorkerSpec(args.app, worker_settings(settings, 2), args.log_level, 2)))
    assert (spec.app, spec.log_level, spec.slot) == ("my.mod:app", "debug", 2)
    assert (spec.settings.app_id, spec.settings.sink, spec.settings.metrics_port) == ("a", "kafka", 0)
    assert _parser().parse_args(["run", "x:y"]).workers == 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_workers_must_be_positive(value: str) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "x:y", "--workers", value])


WRITE_METRICS = textwrap.dedent("""
    import sys
    from pipeline.metrics import Metrics
    metrics = Metrics()
    metrics.ready.set(int(sys.argv[1]))
    metrics.assigned.set(2)
    metrics.records_in.labels("0").inc(5)
""")


def test_the_supervisor_serves_the_workers_metrics_merged_and_knows_who_is_ready(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    ready, restoring = (subprocess.Popen([sys.executable, "-c", WRITE_METRICS, flag], env=env) for flag in "10")
    assert ready.wait(30) == 0 and restoring.wait(30) == 0
    metrics = WorkerMetrics(str(tmp_path))
    text = metrics.exposition().decode()
    assert "pipeline_assigned_partitions 4.0" in text  # livesum
    assert 'pipeline_records_in_total{partition="0"} 10.0' in text
    assert f'pipeline_ready{{pid="{restoring.pid}"}} 0.0' in text
    assert metrics.ready_pids() == {ready.pid}
    metrics.forget(Slot(0), ready.pid)  # exited: its live gauges leave, its counters stay
    assert metrics.ready_pids() == set()
    assert 'pipeline_records_in_total{partition="0"} 10.0' in metrics.exposition().decode()


def test_the_supervisor_knows_whose_poll_loop_is_stuck(tmp_path: Path) -> None:
    """Its /live: the workers' last turns (pipeline_loop_last_turn_timestamp_seconds, one sample per pid)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    script = "import sys; from pipeline.metrics import Metrics; Metrics().loop_turned.set(float(sys.argv[1]))"
    turned = {"1000": None, "1090": None}
    for at in turned:
        process = subprocess.Popen([sys.executable, "-c", script, at], env=env)
        assert process.wait(30) == 0
        turned[at] = process.pid
    metrics = WorkerMetrics(str(tmp_path))
    assert metrics.stuck_pids(60, now=1100.0) == {turned["1000"]}  # 100 s ago; the other 10 s ago
    assert metrics.stuck_pids(60, now=1050.0) == set()
    assert metrics.stuck_pids(5, now=1100.0) == set(turned.values())


SLEEPER = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(60)"


def test_real_workers_are_restarted_after_sigkill_and_stopped_by_sigterm() -> None:
    supervisor = Supervisor(2, [sys.executable, "-c", SLEEPER], lambda slot: dict(os.environ), first_backoff_s=0.05)
    supervisor.start()
    try:
        victim = supervisor.slots[1].process
        os.kill(victim.pid, signal.SIGKILL)
        eventually(lambda: supervisor.check() is None and supervisor.slots[1].process not in (None, victim), 10, 0.05)
    finally:
        supervisor.stop()
        eventually(lambda: supervisor.check() is None and not supervisor.running(), 20, 0.05)
    assert supervisor.unclean == []


def test_pipeline_run_workers_rejects_a_bad_app_before_starting_any() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "--workers", "2", "no.such.module:app"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "worker" not in result.stderr


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_a_second_signal_kills_workers_that_do_not_stop() -> None:
    supervisor = Supervisor(
        1,
        [sys.executable, "-c", STUBBORN],
        lambda slot: dict(os.environ),
        spawn=lambda command, env, payload: subprocess.Popen(command, env=env, stdout=subprocess.PIPE),
    )
    supervisor.start()
    assert supervisor.slots[0].process.stdout.readline() == b"up\n"  # it ignores SIGTERM from now on
    supervisor.stop()
    second_signal = threading.Event()
    second_signal.set()
    _wait_stopped(supervisor, second_signal)
    assert supervisor.unclean == ["worker 0: killed by SIGKILL"]


def test_with_queries_each_worker_serves_its_own_port_and_the_supervisors_sends_queries_to_worker_0() -> None:
    env = {"PIPELINE_METRICS_PORT": "9100", "PIPELINE_QUERY_ENABLED": "true"}
    settings = load_settings(None, {**env, "PIPELINE_QUERY_ADDRESS": "pod-7.svc:9100"})
    workers = [worker_settings(settings, slot) for slot in (0, 1)]
    assert [(w.metrics_port, w.query_address) for w in workers] == [(9101, "pod-7.svc:9101"), (9102, "pod-7.svc:9102")]
    assert worker_settings(load_settings(None, env), 1, host="node-3").query_address.endswith(":9102")
    route = to_a_worker(settings)
    assert route is not None and route("/metrics", {}) is None
    assert route("/state/acct-1?min_offset=3", {}) == (
        307,
        b"",
        {"Location": "http://pod-7.svc:9101/state/acct-1?min_offset=3", "Content-Type": "text/plain"},
    )
    assert route("/state?prefix=a", {})[0] == 307 and route("/tables/t/k", {})[0] == 307  # type: ignore[index]
    assert to_a_worker(load_settings(None, {"PIPELINE_METRICS_PORT": "9100"})) is None


def test_a_metrics_port_another_process_has_stops_the_supervisor_before_any_worker_with_the_setting_named(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Supervisor] = []
    monkeypatch.setattr(Supervisor, "start", started.append)
    monkeypatch.setattr("pipeline.supervisor.signal.signal", lambda *args: None)  # pytest's own handlers stay
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = load_settings(None, {"PIPELINE_METRICS_PORT": str(port), "PIPELINE_METRICS_HOST": "127.0.0.1"})
        code = supervise("pipeline.examples.copier:app", settings, 2, "info", threading.Event(), "ports")
    assert code == CONFIG_ERROR_EXIT and not started
    assert f"METRICS_PORT: cannot listen on 127.0.0.1:{port} (Address already in use)" in caplog.text
