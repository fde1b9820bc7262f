"""Pipeline instances as podman containers of the service image, for the fault runs of pipeline.testing.chaos.

`ContainerFleet` stands in for `harness.Fleet`: each instance is `podman run --network host IMAGE run MODULE:ATTR`,
and the faults hit the container, not the podman client: SIGKILL is `podman kill -s KILL`, a zombie is `podman pause`
(the cgroup freezer, as a stopped VM or a long GC pause would look to the broker) until `podman unpause`.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.testing.harness import FAST_FAILOVER, Fleet, Instance

REPO = Path(__file__).resolve().parents[2]
ENGINE_SH = REPO / "deploy" / "image" / "engine.sh"
BUILD_SH = REPO / "deploy" / "image" / "build.sh"
FRESH_SH = REPO / "deploy" / "image" / "fresh.sh"
SERVICE_IMAGE = "localhost/eos-pipeline:local"
COMPACTION_IMAGE = "localhost/eos-pipeline-compaction:local"
BUILD_TIMEOUT_S = 1800  # cold: the compaction image downloads a JRE, Maven, pyspark and the connector
START_TIMEOUT_S = 120  # vfs copies the whole image for every container: seconds on a busy machine


def podman(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s, check=check)


def container_running(container: str) -> bool:
    result = podman("container", "inspect", "--format", "{{.State.Running}}", container, check=False)
    return result.returncode == 0 and result.stdout.strip() == "true"


@dataclass
class ContainerInstance(Instance):
    container: str = ""
    paused: bool = False

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            self.sent(sig.name)
            podman("kill", "--signal", sig.name, self.container, check=False)

    def pause(self) -> None:
        if self.alive:
            self.sent("SIGSTOP")
            podman("pause", self.container)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.sent("SIGCONT")
            podman("unpause", self.container, check=False)
            self.paused = False

    def remove(self) -> None:
        podman("rm", "--force", "--ignore", self.container, check=False)


@dataclass
class ContainerFleet(Fleet):
    image: str = SERVICE_IMAGE

    def start(self, count: int = 1, **extra_env: str) -> list[Instance]:
        """Launches the containers together, then waits until each runs (creating one takes seconds with vfs)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = [self._start_one(extra_env) for _ in range(count)]
        for instance in started:
            self._wait_running(instance)
        self.instances += started
        return started

    def _start_one(self, extra_env: Mapping[str, str]) -> ContainerInstance:
        self._started += 1
        name = f"instance-{self._started}"
        container = f"eos-{self.env['PIPELINE_APP_ID']}-{name}"
        log_path = self.log_dir / f"{name}.log"
        env = {
            **FAST_FAILOVER,
            **self.env,
            **extra_env,
            "PIPELINE_BOOTSTRAP_SERVERS": self.bootstrap,
            "PIPELINE_KAFKA_CLIENT_ID": name,
        }
        command = [
            "podman",
            "run",
            "--rm",
            "--name",
            container,
            "--network",
            "host",
            *(f"--env={k}={v}" for k, v in env.items()),
            self.image,
            *self._log_level_args(),
            "run",
            self.app_spec,
        ]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return ContainerInstance(name, process, log_path, container=container)

    def _log_level_args(self) -> tuple[str, ...]:
        level = getattr(self, "log_level", None)  # `pipeline --log-level`, where the fleet has one
        return ("--log-level", level) if level else ()

    @staticmethod
    def _wait_running(instance: ContainerInstance) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not container_running(instance.container):
            if not instance.alive or time.monotonic() > deadline:
                raise AssertionError(f"container {instance.container} did not start:\n{instance.log_tail()}")
            time.sleep(0.2)

    def remove_all(self) -> None:
        for instance in self.instances:
            if isinstance(instance, ContainerInstance):
                instance.resume()
                instance.remove()
