"""The fault runs behind `pipeline chaos`, the soak and the fault tests: one run on fresh topics (FaultRun), the
faults it can inject (FAULTS), and the session profile. The command line is pipeline/testing/chaos.py."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Producer

from pipeline.app import App, Generated
from pipeline.registry import client_for, uses_registry
from pipeline.settings import Settings
from pipeline.sinks.postgres.tables import Target
from pipeline.testing import checker, inputs, postgres_checker
from pipeline.testing.drain import Observer, observe
from pipeline.testing.harness import (
    FAST_FAILOVER,
    Fleet,
    Instance,
    exited_by_themselves,
    group_protocol,
    kafka_env,
    set_group_failover,
    wait_caught_up,
)
from pipeline.testing.oracle import KafkaRecord, Verdict, observer_subset_of_final

ProducedRecord = tuple[int, bytes, bytes]
KAFKA_SH = Path(__file__).resolve().parents[2] / "deploy" / "local" / "kafka.sh"  # from a checkout: the repository root
SESSION_TIMEOUT_S = int(FAST_FAILOVER["PIPELINE_SESSION_TIMEOUT_MS"]) / 1000
TRANSACTION_TIMEOUT_S = int(FAST_FAILOVER["PIPELINE_TRANSACTION_TIMEOUT_MS"]) / 1000


# -- one fault run ----------------------------------------------------------------------------------------------------
@dataclass
class FaultRun:
    """Fresh topics and app id, paced input, a fleet of instances, and the checker at the end.

    On a secured cluster, `client_config` (librdkafka properties: security protocol, credentials, CA) is what this
    run's own clients use (topic creation, input, observer, offsets, checker: an admin's, who may read everything),
    and `service_config` what the pipeline processes get as PIPELINE_KAFKA_* (the service's principal). Both empty:
    a plain broker, as before."""

    app: App
    app_spec: str
    bootstrap: str
    partitions: int
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    replication: int = 1
    client_config: dict[str, str] = field(default_factory=dict)
    service_config: dict[str, str] = field(default_factory=dict)
    log_level: str | None = None  # the processes' `pipeline --log-level`
    postgres_dsn: str | None = None  # SINK=postgres: each run writes to a fresh schema of this database
    fleet: Fleet | None = None
    observer: Observer | None = None
    _feeder: threading.Thread | None = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.app_id, self.input_topic, self.output_topic = f"chaos-{suffix}", f"in-{suffix}", f"out-{suffix}"
        self.tables = postgres_checker.Tables(self.postgres_dsn, f"chaos_{suffix}") if self.postgres_dsn else None
        # An App with several inputs or tables keeps its topic names with a suffix (TOPIC_SUFFIX); one input: renamed.
        self.several = self.app.multi_input or bool(self.app.global_tables)
        self.suffix = f"-{suffix}" if self.several else ""
        if self.several:
            self.run_app = self.app.with_topic_suffix(self.suffix)
            self.input_topic, self.output_topic = self.run_app.input_topic, self.run_app.output_topic
        else:
            self.run_app = self.app.with_topics(self.input_topic, self.output_topic)
        self._create_topics()

    def _create_topics(self) -> None:
        create = partial(
            inputs.create_topics, self.bootstrap, replication=self.replication, extra_config=self.client_config
        )
        streams = [s.topic for s in self.run_app.streams]
        # Kept whatever their timestamps: a generator's are fixed dates, and a broker restarted mid-run deleted
        # such records by time (retention.ms) before the pipeline read them.
        create({topic: self.partitions for topic in [*streams, self.output_topic]}, config={"retention.ms": "-1"})
        tables = [t.topic for t in (*self.run_app.table_specs.values(), *self.run_app.global_table_specs.values())]
        if tables:
            create({topic: self.partitions for topic in tables}, config={"cleanup.policy": "compact"})

    def start(self, instances: int) -> Fleet:
        """Starts `instances` pipeline processes (a second call adds them to the same fleet) and the observer."""
        names = {"PIPELINE_TOPIC_SUFFIX": self.suffix} if self.several else {}
        if not self.several:
            names = {"PIPELINE_INPUT_TOPIC": self.input_topic, "PIPELINE_OUTPUT_TOPIC": self.output_topic}
        env = {
            "PIPELINE_APP_ID": self.app_id,
            **names,
            **kafka_env(self.service_config),
            **(self.tables.env() if self.tables else {"PIPELINE_SINK": "kafka"}),
            **self.env,
        }
        if self.fleet is None:
            if group_protocol(env) == "consumer":
                set_group_failover(self.bootstrap, self.app_id, self.client_config)
            self.fleet = Fleet(self.app_spec, self.bootstrap, env, self.log_dir / self.app_id, self.log_level)
        self.fleet.start(instances)
        if self.observer is None and self.tables is None:
            self.observer = observe(self.bootstrap, self.output_topic, extra_config=self.client_config)
        return self.fleet

    def feed(self, records: Sequence[Any], seconds: float) -> None:
        """Produces the records spread evenly over `seconds`, in the background. An App with several inputs or
        tables generates (topic, partition, key, value, timestamp) items: each goes to its topic, suffixed. A later
        call produces after what an earlier one produces."""
        if self._feeder:
            self._feeder.join()
        if self.several:
            records = [(topic + self.suffix, *rest) for topic, *rest in records]
        self._feeder = threading.Thread(
            target=produce_paced,
            args=(self.bootstrap, None if self.several else self.input_topic, records, seconds, self.client_config),
            daemon=True,
        )
        self._feeder.start()

    def finish(self, timeout_s: float = 120) -> Outcome:
        if self._feeder:
            self._feeder.join(timeout_s)
        if self.tables is not None:
            return self._finish_tables(self.tables, timeout_s)
        assert self.fleet is not None and self.observer is not None  # start() came first
        lag = wait_caught_up(
            self.bootstrap, self.app_id, self.run_app.co_partitioned, self.partitions, timeout_s, self.client_config
        )
        exited = self._stop_fleet()
        observed = self.observer.stop()
        if lag:
            return Outcome(None, lag, [], self.fleet.logs(), exited)
        verdict = checker.verify(
            self.run_app,
            self.bootstrap,
            input_topic=self.input_topic,
            output_topic=self.output_topic,
            dead_letter_topic=f"{self.app_id}-dlq",
            changelog_topic=f"{self.app_id}-changelog",
            group_id=self.app_id,
            timeout_s=60,
            extra_config=self.client_config,
            schema_registry=self._schema_registry(),
        )
        phantoms = observer_subset_of_final(observed, verdict)
        return Outcome(verdict, {}, phantoms, self.fleet.logs(), exited)

    def _schema_registry(self) -> Any:
        """The registry client the checker decodes with, for an App with registry serdes: the processes' registry
        (PIPELINE_SCHEMA_REGISTRY_URL of this run's env, else of this process's, which they inherit); None otherwise."""
        env = {**os.environ, **self.env}
        url = env.get("PIPELINE_SCHEMA_REGISTRY_URL")
        if not url or not uses_registry(self.app):
            return None
        user_info = env.get("PIPELINE_SCHEMA_REGISTRY_USER_INFO", "")
        return client_for(Settings(schema_registry_url=url, schema_registry_user_info=user_info))

    def _finish_tables(self, tables: postgres_checker.Tables, timeout_s: float) -> Outcome:
        """SINK=postgres: the offsets table is what catches up, the tables are what the checker reads."""
        assert self.fleet is not None  # start() came first
        app = self.run_app if self.several else self.app  # several inputs: the topics with this run's suffix
        target = Target(tables.schema, app, self.app_id, self.input_topic)
        lag = postgres_checker.wait_caught_up(
            self.bootstrap, tables.dsn, target, range(self.partitions), timeout_s, self.client_config
        )
        exited = self._stop_fleet()
        if lag:
            return Outcome(None, lag, [], self.fleet.logs(), exited)
        verdict = postgres_checker.verify_tables(
            app,
            self.bootstrap,
            tables.dsn,
            schema=tables.schema,
            input_topic=self.input_topic,
            app_id=self.app_id,
            extra_config=self.client_config,
        )
        if verdict.ok:
            tables.drop()
        return Outcome(verdict, {}, [], self.fleet.logs(), exited)

    def _stop_fleet(self) -> list[str]:
        """Stops every instance; the ones that had exited by themselves before (a crash, whatever the checker finds)."""
        assert self.fleet is not None  # start() came first
        exited = exited_by_themselves(self.fleet.instances)  # before the harness's SIGTERMs
        self.fleet.stop_all()
        return exited

    def abandon(self) -> None:
        if self.fleet:
            self.fleet.stop_all(timeout_s=20)
        if self.observer:
            self.observer.stop()


@dataclass
class Outcome:
    verdict: Verdict | None  # None: did not converge
    stuck: dict[int, int]  # input partition -> records not committed when the wait ended
    phantoms: list[KafkaRecord]  # records a concurrent read_committed reader saw that the final drain lacks
    logs: str
    exited: list[str] = field(default_factory=list)  # instances gone without a kill or stop (exited_by_themselves)

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok and not self.phantoms and not self.exited


def produce_paced(
    bootstrap: str,
    topic: str | None,
    records: Sequence[Any],
    seconds: float,
    extra_config: Mapping[str, Any] | None = None,
) -> None:
    """Records spread evenly over `seconds`: (partition, key, value[, timestamp]) to `topic`, or with `topic` None
    (topic, partition, key, value, timestamp) each to its own."""
    producer = Producer(inputs.producer_config(bootstrap, extra_config) | {"linger.ms": 5})
    steps = max(1, int(seconds * 10))
    per_step = len(records) // steps + 1
    started = time.monotonic()
    for step, first in enumerate(range(0, len(records), per_step), start=1):
        for record in records[first : first + per_step]:
            to, (partition, key, value, *timestamp) = (topic, record) if topic is not None else (record[0], record[1:])
            # timestamp: the App's event time
            producer.produce(to, value, key, partition=partition, timestamp=timestamp[0] if timestamp else 0)
        producer.poll(0)
        time.sleep(max(0.0, started + step * seconds / steps - time.monotonic()))
    if producer.flush(60):
        raise RuntimeError(f"{topic}: input not fully acknowledged")


# -- faults -----------------------------------------------------------------------------------------------------------
class Instances(Protocol):
    """What a fault strikes: the live instances, and more started (a Fleet, or the soak's fleet that spares one)."""

    @property
    def alive(self) -> list[Instance]: ...

    def start(self, count: int = 1) -> list[Instance]: ...


@dataclass(frozen=True)
class Fault:
    """One kind of fault: how often it strikes in a run and what it does to the fleet (or the cluster)."""

    name: str
    description: str
    inject: Callable[[Instances, random.Random], None]
    needs_cluster: bool = False
    env: tuple[tuple[str, str], ...] = ()


def _victim(fleet: Instances, rng: random.Random) -> Instance:
    return rng.choice(fleet.alive)


def _sigkill(fleet: Instances, rng: random.Random) -> None:
    _victim(fleet, rng).kill()
    fleet.start(1)


def _sigterm(fleet: Instances, rng: random.Random) -> None:
    victim = _victim(fleet, rng)
    exit_code = victim.terminate(timeout_s=60)
    if exit_code != 0:
        raise AssertionError(f"SIGTERM: exit code {exit_code}, expected a clean exit; its log:\n{victim.log_tail(60)}")
    fleet.start(1)


def _pause(seconds: float) -> Callable[[Instances, random.Random], None]:
    def inject(fleet: Instances, rng: random.Random) -> None:
        zombie = _victim(fleet, rng)
        zombie.pause()
        time.sleep(seconds)
        zombie.resume()

    return inject


def _scale(fleet: Instances, rng: random.Random) -> None:
    fleet.start(2)
    time.sleep(rng.uniform(1, 3))
    for instance in fleet.alive[:2]:  # the oldest: their partitions must move
        instance.terminate(timeout_s=60)


def _nothing(fleet: Instances, rng: random.Random) -> None:
    pass


def _kafka_sh(*args: str) -> None:
    subprocess.run([str(KAFKA_SH), "--cluster", *args], check=True, capture_output=True, timeout=180)


def _broker_kill(fleet: Instances, rng: random.Random) -> None:
    node = rng.choice([1, 2, 3])
    _kafka_sh("kill", str(node))
    time.sleep(rng.uniform(2, 5))
    _kafka_sh("restart", str(node))


def _broker_pause(fleet: Instances, rng: random.Random) -> None:
    node = rng.choice([1, 2, 3])
    _kafka_sh("pause", str(node))
    time.sleep(rng.uniform(3, 8))
    _kafka_sh("resume", str(node))


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("none", "no fault (baseline)", _nothing),
        Fault("sigkill", "SIGKILL an instance, start a new one", _sigkill),
        Fault("sigterm", "SIGTERM an instance (must exit 0), start a new one", _sigterm),
        Fault("pause-short", "SIGSTOP below the session time-out, then SIGCONT", _pause(SESSION_TIMEOUT_S / 2)),
        Fault(
            "zombie",
            "SIGSTOP past the session time-out, below the transaction time-out",
            _pause((SESSION_TIMEOUT_S + TRANSACTION_TIMEOUT_S) / 2),
        ),
        Fault("zombie-long", "SIGSTOP past the transaction time-out", _pause(TRANSACTION_TIMEOUT_S + 3)),
        Fault("scale", "scale out by 2, then back in", _scale),
        Fault(
            "aborts", "the instances abort every 3rd transaction", _nothing, env=(("PIPELINE_TEST_ABORT_EVERY", "3"),)
        ),
        Fault("broker-kill", "SIGKILL a broker of the 3-node cluster, restart it", _broker_kill, needs_cluster=True),
        Fault("broker-pause", "SIGSTOP a broker of the 3-node cluster, SIGCONT it", _broker_pause, needs_cluster=True),
    )
}
PROCESS_FAULTS = [name for name, f in FAULTS.items() if not f.needs_cluster]
KAFKA_ONLY_FAULTS = ("aborts",)  # the PostgreSQL sink has no Kafka transaction to abort


# -- a whole chaos session --------------------------------------------------------------------------------------------
@dataclass
class Profile:
    records: int = 20_000
    partitions: int = 3
    instances: int = 2
    rounds: int = 2
    seconds: float = 12.0  # input is fed over this long; faults strike inside it


def run_fault(
    fault: Fault,
    app: App,
    app_spec: str,
    bootstrap: str,
    profile: Profile,
    seed: int,
    records: Sequence[Generated],
    log_dir: Path,
    replication: int = 1,
    postgres_dsn: str | None = None,
) -> Outcome:
    rng = random.Random(f"{seed}-{fault.name}")
    run = FaultRun(
        app, app_spec, bootstrap, profile.partitions, log_dir, dict(fault.env), replication, postgres_dsn=postgres_dsn
    )
    try:
        run.feed(records, profile.seconds)
        fleet = run.start(profile.instances)
        started = time.monotonic()
        for moment in sorted(rng.uniform(1, profile.seconds) for _ in range(profile.rounds)):
            time.sleep(max(0.0, started + moment - time.monotonic()))
            fault.inject(fleet, rng)
        return run.finish()
    finally:
        run.abandon()


def seed_records(app: App, profile: Profile, seed: int, replay: Iterable[ProducedRecord] | None) -> list[Generated]:
    if replay is not None:
        return list(replay)
    if app.generate is None:
        raise SystemExit(f"{app.name}: the App has no `generate`; pass --replay-topic to reuse real input")
    return list(app.generate(profile.records, profile.partitions, seed))
