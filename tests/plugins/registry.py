"""A real Schema Registry for the tests: `SCHEMA_REGISTRY_URL` if set, else the project's own local registry
(deploy/local/registry.sh: Apicurio Registry, Confluent-compatible API), started for the session if it is not running
and stopped at the end only if this session started it (KEEP_REGISTRY=1 leaves it running; tests/run.sh starts it
once for both of make test's lanes).

`schema_registry` is shared by every test of the session (and by the other lane): a test that pauses it freezes it
for all of them. A test whose fault is the registry itself (paused, restarted) takes `private_schema_registry`
instead: a registry of its own on a free port, stopped after the test (~5 CPU seconds and ~200 MB while it runs).

Every test that asks for one of these is marked `kafka` (tests/plugins/servers.py), so `pytest -m "not kafka"` never
starts a registry. Subjects outlive a test (the local registry keeps them across restarts): name them uniquely per
test, as topics are."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REGISTRY_SH = Path(__file__).resolve().parents[2] / "deploy" / "local" / "registry.sh"


def registry_sh(*args: str, env: Mapping[str, str] | None = None) -> str:
    """Runs deploy/local/registry.sh; its stderr in the error when it fails (a first start may build: minutes)."""
    try:
        done = subprocess.run(
            [str(REGISTRY_SH), *args], env=env, check=True, capture_output=True, text=True, timeout=900
        )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{REGISTRY_SH.name} {' '.join(args)} failed:\n{exc.stderr.strip()}") from exc
    return done.stdout.strip()


@dataclass
class SchemaRegistry:
    """A registry under test. `url` is what clients take as `schema.registry.url`. `pid` is its java process when it
    runs on this machine (None for an external SCHEMA_REGISTRY_URL): pause() / resume() freeze and thaw it with
    SIGSTOP / SIGCONT, and skip the test where there is no process to signal. A private registry can also restart()
    (its schemas are kept) and kill() (SIGKILL; start() brings it back)."""

    url: str
    pid: int | None = None
    script_env: dict[str, str] | None = field(default=None, repr=False)  # registry.sh's environment, if private

    def _signal(self, sig: signal.Signals) -> None:
        if self.pid is None:
            pytest.skip(f"the registry at {self.url} (SCHEMA_REGISTRY_URL) is not a local process: cannot signal it")
        os.kill(self.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _script(self, *args: str) -> str:
        if self.script_env is None:
            raise RuntimeError("only a private_schema_registry is started and stopped by its test")
        return registry_sh(*args, env=self.script_env)

    def start(self) -> None:
        self._script("start")
        self.pid = int(self._script("pid"))

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self._script("stop")  # forgets the dead process's pid file

    def restart(self) -> None:
        self._script("stop")
        self.start()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistry]:
    if url := os.environ.get("SCHEMA_REGISTRY_URL"):
        yield SchemaRegistry(url=url.rstrip("/"))
        return
    was_running = registry_sh("status") != "stopped"
    registry_sh("start")
    pid = int(registry_sh("pid"))
    try:
        yield SchemaRegistry(url=registry_sh("url"), pid=pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # never left frozen by a test that failed before its resume()
        if not was_running and os.environ.get("KEEP_REGISTRY") != "1":
            registry_sh("stop")


@pytest.fixture(scope="session")
def schema_registry_url(schema_registry: SchemaRegistry) -> str:
    return schema_registry.url


@pytest.fixture
def private_schema_registry(tmp_path: Path) -> Iterator[SchemaRegistry]:
    """A registry of this test's own (port, run dir under tmp_path), for tests that pause, kill or restart it. The
    local script's only: skipped when SCHEMA_REGISTRY_URL names an external registry."""
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        pytest.skip("SCHEMA_REGISTRY_URL names an external registry: no local registry is started")
    env = {**os.environ, "REGISTRY_PORT": str(_free_port()), "PIPELINE_RUN_DIR": str(tmp_path / "run")}
    registry = SchemaRegistry(url=registry_sh("url", env=env), script_env=env)
    registry.start()
    try:
        yield registry
    finally:
        registry_sh("stop", env=env)  # resumes a paused one first
