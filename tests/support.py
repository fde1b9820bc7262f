"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T], timeout_s: float = 20.0, interval_s: float = 0.1) -> T:
    """Calls probe until it returns something truthy; fails with its last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            assert value, f"condition not met within {timeout_s}s (last value: {value!r})"
            return value
        time.sleep(interval_s)


def docker_available() -> bool:
    """True when a Docker-compatible API answers at DOCKER_HOST (or docker-py's default socket): Docker's, or
    podman's (`podman system service`). Then the tests start their servers through testcontainers
    (tests/image/servers.py)."""
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False
