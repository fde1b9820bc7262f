"""One service process: the runner of the chosen sink, run until SIGTERM or SIGINT. `pipeline run` (pipeline/cli.py)
runs it in its own process; `pipeline run --workers N` (pipeline/supervisor.py) runs it in each worker process, with
the settings the command line parsed once."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from pipeline.app import App
from pipeline.settings import Settings

if TYPE_CHECKING:  # the runners' imports (confluent_kafka, psycopg) wait until a service really runs
    from pipeline.core.loop import PollLoop

# The exit code of a process whose every partition stopped (docs/guarantees.md: fail-fast): an orchestrator restarts it
# with a back-off (as the supervisor does a worker), and each start stops again at the same place until it is fixed.
PARTITIONS_STOPPED_EXIT = 3
LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def check_app(app: App, settings: Settings) -> None:
    """What the App cannot do with these settings (a topic setting that does not fit it, a sink that cannot run it):
    ConfigError before any broker is asked, so that the first error is the one to fix."""
    from pipeline.core.configure import configured

    configured(app, settings)
    if settings.sink == "postgres":
        from pipeline.sinks.postgres.tables import refuse_unfit

        refuse_unfit(app, settings)


def check_connection(settings: Settings) -> None:
    """Bad credentials or an untrusted certificate: librdkafka would retry for ever; ConfigError names the setting."""
    from pipeline.kafka.connect import connect_check

    connect_check(settings)


def check_registry(app: App, settings: Settings) -> None:
    """An App with registry serdes: the registry answers, accepts the credentials, and every output schema fits its
    subject; ConfigError naming the setting or the subject otherwise, before anything is consumed."""
    from pipeline.core.configure import configured
    from pipeline.registry import check, uses_registry

    if uses_registry(app):
        check(configured(app, settings), settings)


def runner_for(app: App, settings: Settings) -> PollLoop:
    """The sink's runner: PIPELINE_SINK=postgres (or --sink postgres) writes into PostgreSQL, else into Kafka.
    Each is imported only when chosen: the Kafka sink never loads psycopg."""
    if settings.sink == "postgres":
        from pipeline.sinks.postgres.runner import PostgresRunner

        return PostgresRunner(app, settings)
    from pipeline.sinks.kafka.runner import KafkaRunner

    return KafkaRunner(app, settings)


def run_service(app: App, settings: Settings, stop_requested: threading.Event) -> int:
    """Runs `app` until stopped; 0 on a clean stop, PARTITIONS_STOPPED_EXIT once every partition it owned stopped. A
    stop requested before the runner starts (SIGTERM during the start-up) ends it at once: nothing is owned yet, so
    there is nothing to commit."""
    check_app(app, settings)
    check_connection(settings)
    check_registry(app, settings)
    runner = runner_for(app, settings)
    runner.install_signal_handlers()
    if stop_requested.is_set():
        return 0
    runner.run()
    return PARTITIONS_STOPPED_EXIT if runner.all_stopped else 0
