"""`python -m pipeline.worker --supervisor PID`: one worker of `pipeline run --workers N` (pipeline/supervisor.py),
which hands it, on its standard input, its WorkerSpec: the App's MODULE:ATTR, its settings, log level and slot. It
runs the service as `pipeline run` does in a single process (pipeline/service.py), and dies with the supervisor."""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import warnings

from pipeline.loading import AppPathError, load_app
from pipeline.service import configure_logging, run_service
from pipeline.settings import ConfigError
from pipeline.supervisor import CONFIG_ERROR_EXIT, WorkerSpec


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--supervisor":
        print(
            "usage: python -m pipeline.worker --supervisor PID (started by pipeline run --workers N)", file=sys.stderr
        )
        return CONFIG_ERROR_EXIT
    _die_with_supervisor(int(argv[1]))
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    # A SIGTERM while starting is a clean stop too, as for `pipeline run` (pipeline/cli.py).
    stop_requested = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_requested.set())
    configure_logging(spec.log_level)
    # Gauge.remove (a partition's gauges when it leaves) is not implemented in multiprocess mode: the value stays in
    # this worker's file until it exits, and the partition's next owner's value, more recent, is the one shown.
    warnings.filterwarnings("ignore", message="Removal of labels has not been implemented")
    try:
        settings = spec.settings
        if settings.state_dir:  # one process per state directory (pipeline/state/local_stores.py): STATE_DIR/w<slot>
            settings = settings.with_overrides(state_dir=os.path.join(settings.state_dir, f"w{spec.slot}"))
        return run_service(load_app(spec.app), settings, stop_requested)
    except AppPathError as e:
        print(f"pipeline run: {e}", file=sys.stderr)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
    return CONFIG_ERROR_EXIT


def _die_with_supervisor(supervisor_pid: int) -> None:
    """SIGTERM to this worker when the supervisor dies, however it dies (Linux); a worker whose supervisor is already
    gone exits at once."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        sys.exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
