"""Who each worker of `pipeline run --workers N` is (pipeline/supervisor.py): its static-member id, and with
QUERY_ENABLED (README: Query the state) the port it answers the partitions it owns on, METRICS_PORT + 1 + slot, which
its heartbeats carry; and the supervisor's port sending queries to worker 0, which answers or sends on to the owner."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.endpoint import health_server
from pipeline.metrics import Exposition, HealthServer, Routes
from pipeline.settings import Settings


def instance_id_base(settings: Settings, host: str | None = None) -> str:
    """What the workers' static ids start with: GROUP_INSTANCE_ID, or this host's name (unique per host: a
    StatefulSet's pod name, a machine's name)."""
    return settings.group_instance_id or host or socket.gethostname()


def worker_settings(settings: Settings, slot: int, host: str | None = None) -> Settings:
    """The settings of the worker in `slot`: its own static-member id (static members need distinct ids), and no
    metrics port (the supervisor serves the one endpoint); with QUERY_ENABLED its own port for queries."""
    ids = {"group_instance_id": f"{instance_id_base(settings, host)}-w{slot}", "metrics_port": 0}
    return settings.with_overrides(**ids | worker_query_settings(settings, slot, host))


def worker_query_settings(settings: Settings, slot: int, host: str | None = None) -> dict[str, Any]:
    """What the worker in `slot` overrides to answer queries: with QUERY_ENABLED, its own port for the queries of the
    partitions it owns, METRICS_PORT + 1 + slot, and that address in the directory its heartbeats carry."""
    if not (settings.query_enabled and settings.metrics_port):
        return {}
    port = worker_query_port(settings, slot)
    return {"metrics_port": port, "query_address": f"{query_host(settings, host)}:{port}"}


def worker_query_port(settings: Settings, slot: int) -> int:
    return settings.metrics_port + 1 + slot


def query_host(settings: Settings, host: str | None = None) -> str:
    """Where the others reach this host's workers: QUERY_ADDRESS's host (the supervisor's address), else this host's
    name."""
    return settings.query_address.rpartition(":")[0] if settings.query_address else host or socket.gethostname()


def to_a_worker(settings: Settings) -> Routes | None:
    """With QUERY_ENABLED, the supervisor's port sends a query to worker 0 (307), which answers it or sends it on to
    the owner: a client may be given the one address of the service."""
    if not settings.query_enabled:
        return None
    worker = f"{query_host(settings)}:{worker_query_port(settings, 0)}"

    def route(path: str, headers: Mapping[str, str]) -> tuple[int, bytes, Mapping[str, str]] | None:
        if path == "/state" or path.startswith(("/state/", "/state?", "/tables/")):
            return 307, b"", {"Location": f"http://{worker}{path}", "Content-Type": "text/plain"}
        return None

    return route


def supervisor_endpoint(
    settings: Settings, metrics: Exposition, is_ready: Callable[[], bool], is_live: Callable[[], bool]
) -> HealthServer | None:
    """The supervisor's one endpoint for all workers on METRICS_PORT (0: none), started, queries sent on to worker 0;
    a port another process has is a ConfigError naming the setting (socketserver's traceback was all a user got)."""
    server = health_server(settings, metrics, is_ready, is_live, to_a_worker(settings))
    return server.start() if server is not None else None
