"""The HTTP endpoint on METRICS_PORT (/metrics, /ready, /live and the queries' routes), for one instance
(pipeline/core/loop.py) and for the supervisor of `--workers N` (pipeline/worker_identity.py)."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.metrics import Exposition, HealthServer, Routes
from pipeline.settings import Settings, port_taken


def health_server(
    settings: Settings,
    metrics: Exposition,
    is_ready: Callable[[], bool],
    is_live: Callable[[], bool],
    routes: Routes | None,
) -> HealthServer | None:
    """Bound, not started, on METRICS_PORT (0: none). A port another process has is a ConfigError naming the setting:
    socketserver's traceback was all a user got."""
    port, host = settings.metrics_port, settings.metrics_host
    if not port:
        return None
    try:
        return HealthServer(metrics, is_ready, port, host, is_live=is_live, routes=routes)
    except OSError as e:
        raise port_taken(host, port, e) from e
