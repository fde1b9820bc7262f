"""Runs against the SASL_SSL broker (tests/conftest.py: kafka_secure): the run's own clients (topics, input, observer,
offsets, checker) as the super user `admin`, the pipeline processes as `pipeline`, the compaction job as
`compaction`, each with exactly the ACLs of pipeline/kafka/acls.py that a test grants (and revokes afterwards)."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from pipeline.kafka.acls import Acl, Names, binding_filters, bindings
from pipeline.loading import load_app
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import inputs, postgres_checker
from pipeline.testing.faults import FaultRun, produce_paced
from pipeline.testing.harness import Fleet, kafka_env
from pipeline.testing.oracle import Verdict

if TYPE_CHECKING:
    from tests.conftest import SecureBroker

PARTITIONS = 3
TOTALS = "pipeline.examples.running_totals:app"
PIPELINE, COMPACTION = "User:pipeline", "User:compaction"
REQUEST_S = 20


def service_config(secure: SecureBroker, user: str = "pipeline", **overrides: str) -> dict[str, str]:
    """A principal's client settings without the bootstrap servers (the processes get those separately)."""
    config = {k: v for k, v in secure.client_config(user).items() if k != "bootstrap.servers"}
    return config | overrides


def names_of(run: FaultRun) -> Names:
    return Names(run.app_id, run.input_topic, run.output_topic)


class Grants:
    """ACLs granted by one test, revoked at its end (the broker is shared by the whole session)."""

    def __init__(self, secure: SecureBroker) -> None:
        self.admin = AdminClient(secure.client_config("admin"))
        self.granted: list[tuple[str, Acl]] = []

    def grant(self, principal: str, acls: Iterable[Acl]) -> None:
        acls = list(acls)
        for future in self.admin.create_acls(bindings(principal, acls)).values():
            future.result(REQUEST_S)
        self.granted += [(principal, acl) for acl in acls]

    def revoke(self, principal: str, acls: Iterable[Acl]) -> None:
        acls = list(acls)
        for future in self.admin.delete_acls(binding_filters(principal, acls)).values():
            future.result(REQUEST_S)
        self.granted = [(p, a) for p, a in self.granted if not (p == principal and a in acls)]

    def revoke_all(self) -> None:
        for principal in {p for p, _ in self.granted}:
            self.revoke(principal, [a for p, a in self.granted if p == principal])


@pytest.fixture
def grants(kafka_secure: SecureBroker) -> Iterator[Grants]:
    granted = Grants(kafka_secure)
    yield granted
    granted.revoke_all()


@pytest.fixture
def secure_run(kafka_secure: SecureBroker, tmp_path: Path) -> Iterator:
    """FaultRun on the secured broker: fresh topics (created by admin), processes as User:pipeline."""
    runs: list[FaultRun] = []

    def make(
        app_spec: str = TOTALS, log_level: str | None = None, service: dict[str, str] | None = None, **env: str
    ) -> FaultRun:
        run = FaultRun(
            load_app(app_spec),
            app_spec,
            kafka_secure.bootstrap,
            PARTITIONS,
            tmp_path / "logs",
            {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()},
            client_config=kafka_secure.client_config("admin"),
            service_config=service if service is not None else service_config(kafka_secure),
            log_level=log_level,
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.abandon()


def totals_records(n: int, seed: int = 0, poison_every: int = 0) -> list[inputs.ProducedRecord]:
    return list(inputs.running_totals_records(n, partitions=PARTITIONS, seed=seed, poison_every=poison_every))


def refused_start(run: FaultRun, bound_s: float, what: str) -> str:
    """One more instance started, which must exit 2 within bound_s (else killed, and the test fails naming `what`);
    its log."""
    instance = run.start(1).instances[-1]
    try:
        exit_code = instance.wait_for_exit(bound_s)
    except subprocess.TimeoutExpired:
        instance.kill()
        pytest.fail(f"{what}: still running {bound_s}s after start:\n{instance.log_tail()}")
    log = instance.log_path.read_text(errors="replace")
    assert exit_code == 2, log
    return log


def log_text(run: FaultRun) -> str:
    return "\n".join(i.log_path.read_text(errors="replace") for i in run.fleet.instances) if run.fleet else ""


# -- the PostgreSQL sink ---------------------------------------------------------------------------------------------
TOTALS_PG = "pipeline.examples.running_totals_pg:app"


@dataclass
class SecurePgRun:
    """A PostgreSQL-sink run on the secured broker: input topic and records by admin, `pipeline run --sink postgres`
    processes as User:pipeline writing with `dsn`, the table checker's verdict (read with `check_dsn`)."""

    secure: SecureBroker
    dsn: str
    check_dsn: str
    schema: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    log_level: str | None = None
    fleet: Fleet | None = None
    _feeder: threading.Thread | None = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.app_id, self.input_topic = f"pg-{suffix}", f"pg-in-{suffix}"
        self.admin_config = self.secure.client_config("admin")
        self.app = load_app(TOTALS_PG)
        inputs.create_topics(self.secure.bootstrap, {self.input_topic: PARTITIONS}, extra_config=self.admin_config)

    @property
    def names(self) -> Names:
        return Names(self.app_id, self.input_topic, "")

    def produce(self, records: list[inputs.ProducedRecord]) -> None:
        inputs.produce(
            self.secure.bootstrap, self.input_topic, records, partitions=PARTITIONS, extra_config=self.admin_config
        )

    def feed(self, records: list[inputs.ProducedRecord], seconds: float) -> None:
        """Produces the records spread over `seconds`, in the background (finish() waits for it)."""
        self._feeder = threading.Thread(
            target=produce_paced,
            args=(self.secure.bootstrap, self.input_topic, records, seconds, self.admin_config),
            daemon=True,
        )
        self._feeder.start()

    def start(self, instances: int) -> Fleet:
        if self.fleet is None:
            env = {
                "PIPELINE_SINK": "postgres",
                "PIPELINE_POSTGRES_DSN": self.dsn,
                "PIPELINE_POSTGRES_SCHEMA": self.schema,
                "PIPELINE_APP_ID": self.app_id,
                "PIPELINE_INPUT_TOPIC": self.input_topic,
                **kafka_env(service_config(self.secure)),
                **self.env,
            }
            self.fleet = Fleet(TOTALS_PG, self.secure.bootstrap, env, self.log_dir / self.app_id, self.log_level)
        self.fleet.start(instances)
        return self.fleet

    def finish(self, timeout_s: float = 60) -> Verdict:
        if self._feeder is not None:
            self._feeder.join(timeout_s)
        target = Target(self.schema, self.app, self.app_id, self.input_topic)
        lag = postgres_checker.wait_caught_up(
            self.secure.bootstrap, self.check_dsn, target, range(PARTITIONS), timeout_s, extra_config=self.admin_config
        )
        self.fleet.stop_all(timeout_s=30)
        assert not lag, f"offsets table did not catch up, lag per partition {lag}\n{self.fleet.logs()}"
        return postgres_checker.verify_tables(
            self.app,
            self.secure.bootstrap,
            self.check_dsn,
            schema=self.schema,
            input_topic=self.input_topic,
            app_id=self.app_id,
            extra_config=self.admin_config,
        )


@pytest.fixture
def pg_role(postgres_dsn: str, pg_schema: str) -> Iterator[str]:
    """A database role of its own, with a password of its own (a sentinel the leak test looks for), owning the
    test's schema: the DSN the pipeline processes use."""
    role, password = f"h6_{uuid.uuid4().hex[:8]}", f"SENTINEL-pg-{uuid.uuid4().hex}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(pg_schema), sql.Identifier(role)))
    url = urlsplit(postgres_dsn)
    yield urlunsplit(url._replace(netloc=f"{role}:{password}@{url.hostname}:{url.port}"))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def secure_pg_run(
    kafka_secure: SecureBroker, postgres_dsn: str, pg_schema: str, pg_role: str, tmp_path: Path
) -> Iterator:
    runs: list[SecurePgRun] = []

    def make(log_level: str | None = None, **env: str) -> SecurePgRun:
        run = SecurePgRun(
            kafka_secure,
            pg_role,
            postgres_dsn,
            pg_schema,
            tmp_path / "logs",
            {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()},
            log_level,
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.fleet:
            run.fleet.stop_all(timeout_s=20)
