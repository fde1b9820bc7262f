"""A fault run: fresh topics, seeded input (paced over time so faults land mid-stream), a fleet of real pipeline
processes, and the checker's verdict at the end."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline import checker
from pipeline.examples import inputs
from pipeline.harness import Fleet, wait_caught_up
from pipeline.loading import load_app

PARTITIONS = 3


@dataclass
class FaultRun:
    bootstrap: str
    app_spec: str
    app_id: str
    input_topic: str
    output_topic: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    fleet: Fleet | None = None
    observer: checker.Observer | None = None
    _feeder: threading.Thread | None = None

    def start(self, instances: int) -> Fleet:
        env = {"PIPELINE_APP_ID": self.app_id, "PIPELINE_INPUT_TOPIC": self.input_topic,
               "PIPELINE_OUTPUT_TOPIC": self.output_topic, **self.env}
        self.fleet = Fleet(self.app_spec, self.bootstrap, env, self.log_dir)
        self.fleet.start(instances)
        self.observer = checker.observe(self.bootstrap, self.output_topic)
        return self.fleet

    def feed(self, records: Iterable[inputs.ProducedRecord], seconds: float) -> None:
        """Produces the records spread over `seconds` in a background thread."""
        records = list(records)
        self._feeder = threading.Thread(target=_produce_paced, args=(self.bootstrap, self.input_topic, records,
                                                                     seconds), daemon=True)
        self._feeder.start()

    def finish(self, timeout_s: float = 90) -> checker.Verdict:
        """Waits for the input to be produced and processed, stops the fleet, returns the verdict."""
        if self._feeder:
            self._feeder.join(120)
        lag = wait_caught_up(self.bootstrap, self.app_id, self.input_topic, PARTITIONS, timeout_s)
        self.fleet.stop_all()
        self.observer.stop()
        assert not lag, f"did not catch up, lag per partition {lag}\n{self.fleet.logs()}"
        verdict = checker.verify(
            load_app(self.app_spec), self.bootstrap, input_topic=self.input_topic, output_topic=self.output_topic,
            dead_letter_topic=f"{self.app_id}-dlq", changelog_topic=f"{self.app_id}-changelog", group_id=self.app_id,
        )
        phantom = checker.observer_subset_of_final(self.observer.records, verdict)
        assert not phantom, f"read_committed observer saw records absent from the final drain: {phantom[:5]}"
        return verdict


def _produce_paced(bootstrap: str, topic: str, records: list, seconds: float) -> None:
    producer = Producer(inputs.producer_config(bootstrap) | {"linger.ms": 5})
    chunks = max(1, int(seconds * 10))
    size = max(1, len(records) // chunks + 1)
    started = time.monotonic()
    for i in range(0, len(records), size):
        for partition, key, value in records[i : i + size]:
            producer.produce(topic, value, key, partition=partition)
        producer.poll(0)
        time.sleep(max(0.0, started + (i // size + 1) * seconds / chunks - time.monotonic()))
    assert producer.flush(60) == 0


@pytest.fixture
def fault_run(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    runs: list[FaultRun] = []

    def make(app_spec: str = "pipeline.examples.running_totals:app", **env: str) -> FaultRun:
        suffix = uuid.uuid4().hex[:8]
        run = FaultRun(kafka_bootstrap, app_spec, f"eos-{suffix}", f"in-{suffix}", f"out-{suffix}",
                       tmp_path / "logs", {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()})
        inputs.create_topics(kafka_bootstrap, {run.input_topic: PARTITIONS, run.output_topic: PARTITIONS})
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.fleet:
            run.fleet.stop_all(timeout_s=20)
        if run.observer:
            run.observer.stop()


def assert_exactly_once(verdict: checker.Verdict, run: FaultRun) -> None:
    assert verdict.ok, verdict.summary() + "\n" + (run.fleet.logs() if run.fleet else "")
