"""A real Schema Registry for the tests: `SCHEMA_REGISTRY_URL` if set, else the project's own local registry
(deploy/local/registry.sh: Apicurio Registry, Confluent-compatible API), started for the session if it is not running
and stopped at the end only if this session started it (KEEP_REGISTRY=1 leaves it running).

Every test that asks for `schema_registry` or `schema_registry_url` is marked `kafka` (tests/plugins/servers.py), so
`pytest -m "not kafka"` never starts it. Subjects outlive a test (the registry keeps them across restarts): name
them uniquely per test, as topics are."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REGISTRY_SH = Path(__file__).resolve().parents[2] / "deploy" / "local" / "registry.sh"


def registry_sh(*args: str) -> str:
    """Runs deploy/local/registry.sh; its stderr in the error when it fails (a first start may build: minutes)."""
    try:
        done = subprocess.run([str(REGISTRY_SH), *args], check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{REGISTRY_SH.name} {' '.join(args)} failed:\n{exc.stderr.strip()}") from exc
    return done.stdout.strip()


@dataclass
class SchemaRegistry:
    """The registry under test. `url` is what clients take as `schema.registry.url`. `pid` is its java process when
    it runs on this machine (None for an external SCHEMA_REGISTRY_URL): pause() / resume() freeze and thaw it with
    SIGSTOP / SIGCONT for fault tests, and skip the test where there is no process to signal."""

    url: str
    pid: int | None = None

    def _signal(self, sig: signal.Signals) -> None:
        if self.pid is None:
            pytest.skip(f"the registry at {self.url} (SCHEMA_REGISTRY_URL) is not a local process: cannot pause it")
        os.kill(self.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)


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
