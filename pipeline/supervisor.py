"""`pipeline run --workers N`: N supervised member processes of the consumer group on one host.

One Python process runs on one core (the GIL); a machine with more cores runs more members of the same group. The
supervisor (the process `pipeline run` started) starts N workers, `python -m pipeline.worker`, and hands each,
on its standard input, what the command line parsed once (`WorkerSpec`): the App's MODULE:ATTR, the settings, the
log level, its slot. Each worker runs the service as a single process does (pipeline/service.py), with
    its slot (0..N-1)                   stable: a restarted worker gets the slot (and so the identities) back; also
                                        PIPELINE_WORKER_SLOT in its environment
    GROUP_INSTANCE_ID=<id>-w<slot>      always a static member: <id> is GROUP_INSTANCE_ID, or the host's name when
                                        it is not set (static members need distinct ids; under PRODUCERS=per_process
                                        the producer is named after it, so a restarted worker aborts what the killed
                                        one left open at once: docs/guarantees.md, zombies-stay-out)
    METRICS_PORT=0                      the supervisor serves the one endpoint (/metrics, /ready, /live of all);
                                        with QUERY_ENABLED METRICS_PORT + 1 + slot, for queries of the partitions
                                        it owns (pipeline/worker_identity.py)
    PROMETHEUS_MULTIPROC_DIR=<a temporary directory the supervisor owns and removes>, in its environment
The settings travel on a pipe, never on a command line: they may hold credentials (`ps` shows command lines).
A worker that exits is started again in its slot at once: under its static id it takes its membership and its
partitions back without waiting for the session time-out or a rebalance (issue 22); with FAILURE_DETECTION_MS, the
supervisor first tells the peers' detectors so on the heartbeat topic (pipeline/kafka/liveness.py: Announcer), or they
would remove the dead one just before the new one joins: a second rebalance. One that keeps failing within a
minute of its start waits 1 s, then doubling up to 30 s. Two supervisors of one group on one host would give their
workers the same ids: a lock file per group and id (in the temporary directory) refuses the second (exit code 2).
Exit code 2 of a worker (configuration or usage error) stops everything instead: a restart would fail the same way.
SIGTERM or SIGINT to the supervisor: each worker gets SIGTERM and stops as a single process does
(commits or aborts what is open, leaves the group), the supervisor waits for all and exits 0; a second signal kills
them. Workers run in their own process group (a terminal's Ctrl-C reaches the supervisor only, which stops them in
order) and die with SIGTERM if the supervisor itself is killed (Linux: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, generate_latest, multiprocess

from pipeline.metrics import HealthServer
from pipeline.retry import Backoff
from pipeline.settings import ConfigError, Settings, live_timeout_ms
from pipeline.worker_identity import instance_id_base, supervisor_endpoint, worker_settings

if TYPE_CHECKING:
    from pipeline.kafka.liveness import Announcer

log = logging.getLogger(__name__)

WORKER_SLOT_ENV = "PIPELINE_WORKER_SLOT"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONFIG_ERROR_EXIT = 2  # cli.py's exit code for a bad setting or App path; argparse's for a bad option
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# A worker that ran this long had a good start: its next exit is restarted after BACKOFF_FIRST_S again.
STABLE_AFTER_S = 60.0
# How soon an exit is noticed: each 50 ms of it is output that stops (issue 22's budget for a restart is 1.5 s).
WATCH_EVERY_S = 0.05
# During a stop, SIGTERM and SIGINT are how a worker that had not yet installed its handlers ends: it owned nothing.
CLEAN_STOP_CODES = (0, -signal.SIGTERM, -signal.SIGINT)


@dataclass(frozen=True)
class WorkerSettings(Settings):
    """Declares PIPELINE_WORKER_SLOT, so that the settings loader (which refuses unknown PIPELINE_* names) accepts it
    in a worker's environment; the worker's entry point imports this module first (pipeline/worker.py)."""

    worker_slot: int = -1  # -1: not a worker of `pipeline run --workers N`


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is told on its standard input: what the command line parsed, once."""

    app: str  # MODULE:ATTR, imported by the worker
    settings: Settings  # the worker's own (worker_settings)
    log_level: str
    slot: int


def restart_delay(quick_failures: int, first_s: float = BACKOFF_FIRST_S) -> float:
    """The wait before restarting a worker that exited `quick_failures` times in a row soon after its start: none
    the first time (a crash), then from `first_s`, doubling (a worker that cannot start)."""
    if quick_failures <= 1:
        return 0.0
    return Backoff(first_s, 2, BACKOFF_MAX_S).delay(quick_failures - 1)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class InstanceIdsTaken(RuntimeError):
    """Another supervisor on this host runs workers of the same group under the same static ids."""


@contextlib.contextmanager
def instance_ids_lock(group: str, base: str, directory: str | None = None) -> Iterator[None]:
    """Held while the workers of `group` run under the ids `<base>-w<slot>`: two live members with one static id
    fence each other (and, PRODUCERS=per_process, each other's producer) for ever."""
    name = hashlib.sha256(f"{group}\0{base}".encode()).hexdigest()[:16]
    path = os.path.join(directory or tempfile.gettempdir(), f"eos-pipeline-{name}.lock")
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InstanceIdsTaken(
                f"another `pipeline run --workers` of group {group!r} on this host runs its workers as {base}-w<slot> "
                f"({path}): set GROUP_INSTANCE_ID to a different value for one of them"
            ) from None
        yield


def worker_env(base: Mapping[str, str], slot: int, metrics_dir: str) -> dict[str, str]:
    """The environment of the worker in `slot`: its slot, and the metrics directory all workers share."""
    env = {k: v for k, v in base.items() if k.lower() != MULTIPROC_DIR_ENV.lower()}
    env[WORKER_SLOT_ENV] = str(slot)
    env[MULTIPROC_DIR_ENV] = metrics_dir
    return env


def worker_command(supervisor_pid: int) -> list[str]:
    """The worker's entry point (pipeline/worker.py), which ties the worker's life to the supervisor's and reads its
    WorkerSpec from standard input."""
    return [sys.executable, "-m", "pipeline.worker", "--supervisor", str(supervisor_pid)]


class Process(Protocol):
    """What the supervisor uses of subprocess.Popen."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def _spawn(command: list[str], env: dict[str, str], payload: bytes) -> Process:
    # process_group=0: a terminal's Ctrl-C (SIGINT to the foreground group) reaches the supervisor only.
    process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, process_group=0)
    assert process.stdin is not None  # stdin=PIPE
    with contextlib.suppress(BrokenPipeError):  # exited at once: the watch sees its exit code
        process.stdin.write(payload)
        process.stdin.close()
    return process


@dataclass
class Slot:
    index: int
    process: Process | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # when an exited worker is started again
    quick_failures: int = 0


class Supervisor:
    """Keeps `count` workers running, one per slot; `check()` is called every WATCH_EVERY_S by the main loop."""

    def __init__(
        self,
        count: int,
        command: list[str],
        env_of: Callable[[int], dict[str, str]],
        *,
        payload_of: Callable[[int], bytes] = lambda slot: b"",
        spawn: Callable[[list[str], dict[str, str], bytes], Process] = _spawn,
        clock: Callable[[], float] = time.monotonic,
        on_exit: Callable[[Slot, int], None] | None = None,
        on_restart: Callable[[Slot], None] | None = None,
        first_backoff_s: float = BACKOFF_FIRST_S,
    ) -> None:
        self.slots = [Slot(i) for i in range(count)]
        self._command = command
        self._env_of = env_of
        self._payload_of = payload_of
        self._spawn = spawn
        self._clock = clock
        self._on_exit = on_exit or (lambda slot, pid: None)
        self._on_restart = on_restart or (lambda slot: None)
        self._first_backoff_s = first_backoff_s
        self.stopping = False
        self.unclean: list[str] = []  # workers that did not stop cleanly when asked to

    def start(self) -> None:
        for slot in self.slots:
            self._start(slot)

    def check(self) -> int | None:
        """Restarts exited workers when their back-off is over; an exit code to give up with, or None."""
        now = self._clock()
        for slot in self.slots:
            code = slot.process.poll() if slot.process is not None else None
            if code is not None and self._exited(slot, code, now):
                return code
            if slot.process is None and slot.restart_at is not None and now >= slot.restart_at and not self.stopping:
                self._start(slot)
                self._on_restart(slot)
        return None

    def stop(self) -> None:
        """SIGTERM to every worker; pending restarts are cancelled."""
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None:
                log.info("worker %d (pid %d): SIGTERM", slot.index, slot.process.pid)
                _signal(slot.process, signal.SIGTERM)

    def kill(self) -> None:
        for slot in self.slots:
            if slot.process is not None:
                log.warning("worker %d (pid %d): SIGKILL", slot.index, slot.process.pid)
                _signal(slot.process, signal.SIGKILL)

    def running(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.process is not None]

    def all_running(self) -> bool:
        return all(slot.process is not None for slot in self.slots)

    def _start(self, slot: Slot) -> None:
        slot.restart_at = None
        slot.process = self._spawn(self._command, self._env_of(slot.index), self._payload_of(slot.index))
        slot.started_at = self._clock()
        log.info("worker %d started: pid %d", slot.index, slot.process.pid)

    def _exited(self, slot: Slot, code: int, now: float) -> bool:
        """Logs the exit and plans the restart; True: give up (stop everything)."""
        assert slot.process is not None  # check() passes the slots whose process exited
        pid, uptime = slot.process.pid, now - slot.started_at
        slot.process = None
        self._on_exit(slot, pid)
        if self.stopping:
            if code in CLEAN_STOP_CODES:
                log.info("worker %d (pid %d) stopped (%s)", slot.index, pid, describe_exit(code))
            else:
                log.error("worker %d (pid %d) %s while stopping", slot.index, pid, describe_exit(code))
                self.unclean.append(f"worker {slot.index}: {describe_exit(code)}")
            return False
        if code == CONFIG_ERROR_EXIT:
            log.error(
                "worker %d (pid %d) %s (a configuration or usage error: a restart would fail the same way); "
                "stopping the other workers",
                slot.index,
                pid,
                describe_exit(code),
            )
            return True
        slot.quick_failures = 1 if uptime >= STABLE_AFTER_S else slot.quick_failures + 1
        delay = restart_delay(slot.quick_failures, self._first_backoff_s)
        slot.restart_at = now + delay
        log.warning(
            "worker %d (pid %d) %s after %.1f s; restarting it in %.1f s",
            slot.index,
            pid,
            describe_exit(code),
            uptime,
            delay,
        )
        return False


def _signal(process: Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited since the last poll: reaped by the next one
        process.send_signal(sig)


class WorkerMetrics:
    """The workers' metrics merged (prometheus-client multiprocess mode) plus the supervisor's restart counter."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(self.registry, path=directory)
        self._workers_only = multiprocess.MultiProcessCollector(None, path=directory)
        self.restarts = Counter(
            "pipeline_worker_restarts", "Workers started again after they exited", ["worker"], registry=self.registry
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def ready_pids(self) -> set[int]:
        """The worker processes whose pipeline_ready gauge (multiprocess mode liveall: one sample per pid) is 1."""
        return {
            int(sample.labels["pid"])
            for metric in self._workers_only.collect()
            if metric.name == "pipeline_ready"
            for sample in metric.samples
            if sample.value == 1 and "pid" in sample.labels
        }

    def stuck_pids(self, timeout_s: float, now: float | None = None) -> set[int]:
        """The worker processes whose poll loop last turned longer than `timeout_s` ago (LIVE_TIMEOUT_MS), by the
        pipeline_loop_last_turn_timestamp_seconds gauge each one sets. One still starting has not set it: not stuck
        (its start is bounded by its own time-outs)."""
        now = time.time() if now is None else now
        return {
            int(sample.labels["pid"])
            for metric in self._workers_only.collect()
            if metric.name == "pipeline_loop_last_turn_timestamp_seconds"
            for sample in metric.samples
            if sample.value > 0 and now - sample.value > timeout_s and "pid" in sample.labels
        }

    def forget(self, slot: Slot, pid: int) -> None:
        """A worker exited: its live gauges leave the exposition (its counters stay: the totals do not go back)."""
        multiprocess.mark_process_dead(pid, self.directory)

    def restarted(self, slot: Slot) -> None:
        self.restarts.labels(str(slot.index)).inc()


def supervise(
    app: str, settings: Settings, workers: int, log_level: str, stop_requested: threading.Event, group: str = ""
) -> int:
    """Runs `workers` workers of the App at `app` (MODULE:ATTR) with these settings until SIGTERM/SIGINT; 0 when all
    stopped cleanly. `group`: the consumer group (APP_ID or the App's name), for the lock on the workers' ids."""
    try:
        with instance_ids_lock(group or app, instance_id_base(settings)):
            return _supervise(app, settings, workers, log_level, stop_requested, group or app)
    except InstanceIdsTaken as e:
        log.error("%s", e)
        return CONFIG_ERROR_EXIT
    except ConfigError as e:
        log.error("configuration error: %s", e)
        return CONFIG_ERROR_EXIT


def _supervise(
    app: str, settings: Settings, workers: int, log_level: str, stop_requested: threading.Event, group: str
) -> int:
    kill_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop_requested.is_set():
            kill_requested.set()  # a second signal: do not wait any longer
        stop_requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if stop_requested.is_set():  # a signal during start-up: nothing started, nothing to stop
        return 0
    with tempfile.TemporaryDirectory(prefix="pipeline-metrics-") as metrics_dir:
        metrics = WorkerMetrics(metrics_dir)
        announcer = _announcer(settings, group)

        def on_restart(slot: Slot) -> None:
            metrics.restarted(slot)
            if announcer is not None:
                announcer.restarting(worker_settings(settings, slot.index).group_instance_id)

        supervisor = Supervisor(
            workers,
            worker_command(os.getpid()),
            lambda slot: worker_env(os.environ, slot, metrics_dir),
            payload_of=lambda slot: pickle.dumps(WorkerSpec(app, worker_settings(settings, slot), log_level, slot)),
            on_exit=metrics.forget,
            on_restart=on_restart,
        )

        def is_ready() -> bool:  # every worker up, and each one's every partition restored
            return supervisor.all_running() and _pids(supervisor.running()) <= metrics.ready_pids()

        def is_live() -> bool:  # no running worker's poll loop stuck (a dead one is restarted, not stuck)
            return not (_pids(supervisor.running()) & metrics.stuck_pids(live_timeout_ms(settings) / 1000))

        code: int | None = None
        health: HealthServer | None = None
        try:
            health = supervisor_endpoint(settings, metrics, is_ready, is_live)  # before any worker starts
            port = health.port if health else "none"
            log.info("%d workers of %s (one process each; metrics on port %s)", workers, app, port)
            supervisor.start()
            code = _watch(supervisor, stop_requested)
        finally:  # whatever ended the watch, no worker outlives the supervisor
            supervisor.stop()
            _wait_stopped(supervisor, kill_requested)
            if health:
                health.stop()
            if announcer is not None:
                announcer.close()
    if code is not None:
        return code
    if supervisor.unclean:
        log.error("stopped, not cleanly: %s", "; ".join(supervisor.unclean))
        return 1
    log.info("all %d workers stopped", workers)
    return 0


def _announcer(settings: Settings, group: str) -> Announcer | None:
    """FAILURE_DETECTION_MS > 0: what tells the workers' peers that a worker restarted at once is coming back, so
    that their detectors leave its place to it (pipeline/kafka/liveness.py: Announcer). Imported only then."""
    if settings.failure_detection_ms <= 0:
        return None
    from pipeline.kafka.clients import client_config
    from pipeline.kafka.liveness import Announcer, liveness_topic

    return Announcer(settings, client_config(settings), liveness_topic(group))


def _watch(supervisor: Supervisor, stop_requested: threading.Event) -> int | None:
    """Until a stop is requested (None) or a worker exits with a code a restart cannot fix (that code)."""
    while not stop_requested.is_set():
        code = supervisor.check()
        if code is not None:
            return code
        stop_requested.wait(WATCH_EVERY_S)
    return None


def _wait_stopped(supervisor: Supervisor, kill_requested: threading.Event) -> None:
    """Until every worker exited; as long as it takes (a worker commits, may publish snapshots), unless a second
    signal asks for SIGKILL. An orchestrator's own time-out (Kubernetes' grace period, systemd's TimeoutStopSec)
    ends it the same way."""
    killed = False
    while supervisor.running():
        if kill_requested.is_set() and not killed:
            supervisor.kill()
            killed = True
        supervisor.check()
        time.sleep(0.05)


def _pids(slots: Iterable[Slot]) -> set[int]:
    return {slot.process.pid for slot in slots if slot.process is not None}
