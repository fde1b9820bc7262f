"""PostgreSQL-sink fault runs: a fresh input topic and schema, paced input, real `pipeline run` processes with
PIPELINE_SINK=postgres, and the table checker's verdict once the offsets table has caught up with the input."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline import settings
from pipeline.loading import load_app
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import inputs, postgres_checker
from pipeline.testing.faults import produce_paced
from pipeline.testing.harness import Fleet
from pipeline.testing.oracle import Verdict

PARTITIONS = 3
TOTALS_PG = "pipeline.examples.running_totals_pg:app"


def runner_settings(
    bootstrap: str, dsn: str, schema: str, app_id: str, input_topic: str, **overrides: Any
) -> settings.Settings:
    """An in-process PostgresRunner's settings: this broker, database and schema, and nothing from the environment."""
    return settings.load(
        env={},
        bootstrap_servers=bootstrap,
        app_id=app_id,
        input_topic=input_topic,
        sink="postgres",
        postgres_dsn=dsn,
        postgres_schema=schema,
        **overrides,
    )


@dataclass
class PgRun:
    bootstrap: str
    dsn: str
    schema: str
    app_spec: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    check_with: str | None = None  # the App the checker folds with (default: app_spec's; a test double's differs)
    fleet: Fleet | None = None
    _feeder: threading.Thread | None = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.app_id, self.input_topic = f"pg-{suffix}", f"pg-in-{suffix}"
        self.app = load_app(self.check_with or self.app_spec)  # never import a test double in this process
        inputs.create_topics(self.bootstrap, {self.input_topic: PARTITIONS})

    @property
    def target(self) -> Target:
        return Target(self.schema, self.app, self.app_id, self.input_topic)

    def start(self, instances: int) -> Fleet:
        env = {
            "PIPELINE_SINK": "postgres",
            "PIPELINE_POSTGRES_DSN": self.dsn,
            "PIPELINE_POSTGRES_SCHEMA": self.schema,
            "PIPELINE_APP_ID": self.app_id,
            "PIPELINE_INPUT_TOPIC": self.input_topic,
            **self.env,
        }
        self.fleet = Fleet(self.app_spec, self.bootstrap, env, self.log_dir / self.app_id)
        self.fleet.start(instances)
        return self.fleet

    def feed(self, records: Sequence[inputs.ProducedRecord], seconds: float) -> None:
        """Produces `records` paced over `seconds`, in the background, after what an earlier call produces."""
        if self._feeder:
            self._feeder.join(120)
        self._feeder = threading.Thread(
            target=produce_paced, args=(self.bootstrap, self.input_topic, list(records), seconds), daemon=True
        )
        self._feeder.start()

    def finish(self, timeout_s: float = 90) -> Verdict:
        """Waits for the input to be produced and written to the tables, stops the fleet, returns the verdict."""
        if self._feeder:
            self._feeder.join(120)
        lag = postgres_checker.wait_caught_up(self.bootstrap, self.dsn, self.target, range(PARTITIONS), timeout_s)
        self.fleet.stop_all(timeout_s=30)
        assert not lag, f"offsets table did not catch up, lag per partition {lag}\n{self.fleet.logs()}"
        return postgres_checker.verify_tables(
            self.app, self.bootstrap, self.dsn, schema=self.schema, input_topic=self.input_topic, app_id=self.app_id
        )

    def logs(self) -> str:
        return "\n".join(i.log_path.read_text(errors="replace") for i in self.fleet.instances) if self.fleet else ""


@pytest.fixture
def pg_run(kafka_bootstrap: str, postgres_dsn: str, pg_schema: str, tmp_path: Path) -> Iterator:
    runs: list[PgRun] = []

    def make(app_spec: str = TOTALS_PG, check_with: str | None = None, **env: str) -> PgRun:
        run = PgRun(
            kafka_bootstrap,
            postgres_dsn,
            pg_schema,
            app_spec,
            tmp_path / "logs",
            {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()},
            check_with,
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.fleet:
            run.fleet.stop_all(timeout_s=20)


def totals_input(n: int, seed: int = 0, poison_every: int = 0) -> list[inputs.ProducedRecord]:
    return list(inputs.running_totals_records(n, partitions=PARTITIONS, seed=seed, poison_every=poison_every))


def assert_exactly_once(verdict: Verdict, run: PgRun) -> None:
    assert verdict.ok, verdict.summary() + "\n" + (run.fleet.logs() if run.fleet else "")
