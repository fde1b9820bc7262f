"""Pipeline processes for fault runs: start N instances, kill / stop / pause them, wait until the group caught up.

Used by the fault tests and the chaos command. Each instance is a real `python -m pipeline run MODULE:ATTR`
process, so SIGKILL and SIGSTOP hit exactly what they would hit in production.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from pipeline.kafka.offsets import high_watermarks
from pipeline.settings import KAFKA_ENV_PREFIX

# Short enough that a fault run on 2 cores takes seconds, long enough for a loaded machine.
FAST_FAILOVER = {
    "PIPELINE_SESSION_TIMEOUT_MS": "6000",
    "PIPELINE_HEARTBEAT_INTERVAL_MS": "500",
    "PIPELINE_TRANSACTION_TIMEOUT_MS": "10000",
    "PIPELINE_REQUEST_TIMEOUT_MS": "10000",
}


def group_protocol(env: Mapping[str, str]) -> str:
    """The GROUP_PROTOCOL pipeline processes get: from their own env, else this process's (the fault suite runs once
    per protocol with PIPELINE_GROUP_PROTOCOL=consumer set for pytest), else classic."""
    return env.get("PIPELINE_GROUP_PROTOCOL") or os.environ.get("PIPELINE_GROUP_PROTOCOL") or "classic"


def set_group_failover(
    bootstrap: str, group: str, config: Mapping[str, Any] | None = None, timeout_s: float = 10
) -> None:
    """GROUP_PROTOCOL=consumer (KIP-848): the session timeout and heartbeat interval are the group's, not the
    client's, so FAST_FAILOVER's are set as group configs (the broker's group.consumer.min.* must allow them:
    deploy/local/kafka.sh)."""
    entries = [
        ConfigEntry(name, FAST_FAILOVER[setting], incremental_operation=AlterConfigOpType.SET)
        for name, setting in (
            ("consumer.session.timeout.ms", "PIPELINE_SESSION_TIMEOUT_MS"),
            ("consumer.heartbeat.interval.ms", "PIPELINE_HEARTBEAT_INTERVAL_MS"),
        )
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = _admin(bootstrap, config)
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout_s)
    except KafkaException as e:
        raise RuntimeError(
            f"GROUP_PROTOCOL=consumer: group {group} cannot fail over within seconds ({e.args[0]}); "
            "the broker needs group.consumer.min.session.timeout.ms <= 6000 and "
            "group.consumer.min.heartbeat.interval.ms <= 500 (deploy/local/kafka.sh sets both: "
            "restart a broker started before)"
        ) from e


def kafka_env(config: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka properties (a secured cluster's, say) as the PIPELINE_KAFKA_* environment of pipeline processes;
    bootstrap.servers is left out (PIPELINE_BOOTSTRAP_SERVERS carries it)."""
    return {
        KAFKA_ENV_PREFIX + key.upper().replace(".", "_"): str(value)
        for key, value in config.items()
        if key != "bootstrap.servers"
    }


def _admin(bootstrap: str, config: Mapping[str, Any] | None) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **(config or {})})


@dataclass
class Instance:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    # (wall-clock time, signal name) of every signal sent: which instance a fault hit, and when (to tell a fast
    # failure detector's removal of a paused or killed instance from a false positive: pipeline/testing/detections.py)
    signals: list[tuple[float, str]] = field(default_factory=list)
    exit_expected: bool = False  # it exited by itself as its test wanted (`wait_for_exit`): not a crash
    state_dir: str = ""  # STATE_STORE=disk: its STATE_DIR

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            self.sent(sig.name)
            self.process.send_signal(sig)

    def sent(self, signal_name: str) -> None:
        """Notes a signal as it is sent (a container harness sends its own way)."""
        self.signals.append((time.time(), signal_name))

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(30)

    def terminate(self, timeout_s: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def wait_for_exit(self, timeout_s: float) -> int:
        """The test expects this instance to exit by itself (a start refused by design): its exit code, once it
        exited within `timeout_s` (subprocess.TimeoutExpired otherwise). From then on it does not count as a crash
        (`exited_by_themselves`)."""
        code = self.process.wait(timeout_s)
        self.exit_expected = True
        return code

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def exited_by_themselves(instances: Sequence[Instance]) -> list[str]:
    """Instances that are gone without a SIGKILL or SIGTERM from the harness: a crash, which the checker alone would
    not see when the others took its partitions over (a soak's process exited on a fenced producer, verdict OK).
    Fault runs (pipeline/testing/faults.py: FaultRun.finish) and soaks fail on any."""
    return [
        f"{i.name} exited by itself (code {i.process.returncode}): {i.log_tail(1)}"
        for i in instances
        if not i.alive and not i.exit_expected and not any(name in ("SIGKILL", "SIGTERM") for _, name in i.signals)
    ]


@dataclass
class Fleet:
    """Instances of one app sharing one consumer group. `env` reaches every instance (a secured cluster's
    credentials as PIPELINE_KAFKA_*, see kafka_env); `log_level` is `pipeline --log-level` (default: info);
    `run_args` are more `pipeline run` options (e.g. --workers 2: each instance is then a supervisor)."""

    app_spec: str
    bootstrap: str
    env: Mapping[str, str]
    log_dir: Path
    log_level: str | None = None
    run_args: tuple[str, ...] = ()
    instances: list[Instance] = field(default_factory=list)
    _started: int = 0

    def start(self, count: int = 1, **extra_env: str) -> list[Instance]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = []
        for _ in range(count):  # each one listed as it starts: the next one's free state directory depends on it
            started.append(self._start_one(extra_env))
            self.instances.append(started[-1])
        return started

    def _start_one(self, extra_env: Mapping[str, str]) -> Instance:
        self._started += 1
        name = f"instance-{self._started}"
        log_path = self.log_dir / f"{name}.log"
        env = {
            **os.environ,
            **FAST_FAILOVER,
            **self.env,
            **extra_env,
            "PIPELINE_BOOTSTRAP_SERVERS": self.bootstrap,
            "PIPELINE_KAFKA_CLIENT_ID": name,
        }
        if env.get("PIPELINE_STATE_STORE") == "disk" and "PIPELINE_STATE_DIR" not in extra_env:
            env["PIPELINE_STATE_DIR"] = self._free_state_dir()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline",
                    *(("--log-level", self.log_level) if self.log_level else ()),
                    "run",
                    *self.run_args,
                    self.app_spec,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return Instance(name, process, log_path, state_dir=env.get("PIPELINE_STATE_DIR", ""))

    def _free_state_dir(self) -> str:
        """STATE_STORE=disk: the first state directory of this fleet no live instance holds, so that an instance
        started after a crash finds the crashed one's stores (a restart on the same disk), as a pod's volume does."""
        held = {i.state_dir for i in self.instances if i.alive}
        slot = 0
        while str(self.log_dir / "state" / f"slot-{slot}") in held:
            slot += 1
        return str(self.log_dir / "state" / f"slot-{slot}")

    @property
    def alive(self) -> list[Instance]:
        return [i for i in self.instances if i.alive]

    def stop_all(self, timeout_s: float = 60) -> None:
        for instance in self.instances:
            instance.resume()
            instance.signal(signal.SIGTERM)
        for instance in self.instances:
            try:
                instance.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                instance.kill()

    def logs(self) -> str:
        return "\n".join(f"--- {i.name} (exit {i.process.poll()}) ---\n{i.log_tail()}" for i in self.instances)


def committed_offsets(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: list[int],
    timeout_s: float,
    config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """The group's committed offsets; `config`: the client settings of a secured cluster (none for a plain one)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, **(config or {}), "group.id": group, "enable.auto.commit": False}
    )
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def wait_caught_up(
    bootstrap: str,
    group: str,
    topic: str | Sequence[str],
    partitions: int,
    timeout_s: float,
    config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Waits until the group's committed offsets reach the end of the input (of every co-partitioned topic, for
    several); returns the last lag seen per partition (summed over the topics) if not."""
    admin = _admin(bootstrap, config)
    topics = [topic] if isinstance(topic, str) else list(topic)
    ends = {t: high_watermarks(admin, t, list(range(partitions)), 10) for t in topics}
    deadline = time.monotonic() + timeout_s
    while True:
        lag: dict[int, int] = dict.fromkeys(range(partitions), 0)
        for t in topics:
            try:
                committed = committed_offsets(bootstrap, group, t, list(range(partitions)), 10, config)
            except KafkaException:
                # A group coordinator that loads or moves (a broker just started or killed) answers late: not caught
                # up yet. `make demo` on a fresh machine failed on one such time-out right after its SIGKILL.
                if time.monotonic() > deadline:
                    raise
                committed = {}
            for p in ends[t]:
                lag[p] += ends[t][p] - max(committed.get(p, 0), 0)
        if not any(lag.values()) or time.monotonic() > deadline:
            return {p: n for p, n in lag.items() if n}
        time.sleep(0.25)


COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


def group_owners(
    bootstrap: str, group: str, timeout_s: float = 10, config: Mapping[str, Any] | None = None
) -> dict[str, list[int]]:
    """client.id of each group member (the instance name) -> the input partitions it owns now."""
    admin = _admin(bootstrap, config)  # kept in a variable: a client collected before its answer never answers
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout_s)
            break
        except KafkaException as e:  # NOT_COORDINATOR on a fresh broker (seen with KIP-848's ConsumerGroupDescribe)
            moving = e.args[0].code() in COORDINATOR_MOVING or e.args[0].retriable()
            if not moving or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return {
        member.client_id: sorted(tp.partition for tp in member.assignment.topic_partitions)
        for member in description.members
    }
