"""A container engine for the image tests, or a skip that says why there is none; podman's Docker-compatible API
for the testcontainers tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.containers import BUILD_SH, BUILD_TIMEOUT_S, ENGINE_SH
from tests.image.servers import build_images, engine_on_this_machine, podman_service


def run_script(*command: object, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout_s)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


@pytest.fixture(scope="session")
def engine() -> None:
    """podman installed and configured (deploy/image/engine.sh) and the bare base image built and runnable; skips
    with the reason when no engine can run here."""
    setup = run_script(ENGINE_SH, "setup", timeout_s=600)
    if setup.returncode != 0:
        pytest.skip(f"no container engine: {_last_line(setup)}")
    base = run_script(BUILD_SH.parent / "base.sh", timeout_s=900)
    if base.returncode != 0:
        pytest.skip(f"no base image could be built here: {_last_line(base)}")
    check = run_script(ENGINE_SH, "check", timeout_s=300)
    if check.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {_last_line(check)}")


@pytest.fixture(scope="session")
def images(engine: None) -> None:
    """The service and compaction images of `make image` (a warm build only compares its inputs). Once the engine
    runs, a failing build is a failure, not a skip."""
    build = run_script(BUILD_SH, timeout_s=BUILD_TIMEOUT_S)
    assert build.returncode == 0, f"make image failed:\n{build.stderr[-6000:]}"


@pytest.fixture(scope="module")
def podman_api(engine: None) -> Iterator[str]:
    """The DOCKER_HOST address of `podman system service` on a socket of its own (stopped afterwards), with the
    server images of deploy/image/servers.sh built and testcontainers set up for an engine on this machine. Once the
    engine runs, a failing build or a service that does not answer is a failure, not a skip."""
    build_images()
    directory = Path(tempfile.mkdtemp(prefix="eos-podman-"))  # short: a socket's path has at most 107 bytes
    try:
        with podman_service(directory) as url, engine_on_this_machine():
            yield url
    finally:
        shutil.rmtree(directory, ignore_errors=True)
