"""running_totals_avro (Avro key and value behind the real Schema Registry) under SIGKILLs, with the registry paused
while records of a schema version the processes have not seen yet arrive: the exactly-once checker passes, nothing is
dead-lettered, and no process exits by itself (issue 30)."""

from __future__ import annotations

import json
import time

from confluent_kafka.schema_registry import SchemaRegistryClient

from pipeline.examples.running_totals_avro import input_encoders, schema
from pipeline.registry import AvroSerde
from pipeline.settings import Settings
from pipeline.testing import inputs
from pipeline.testing.harness import Instance, group_owners, wait_caught_up
from tests.faults.conftest import PARTITIONS, assert_exactly_once
from tests.plugins.registry import SchemaRegistry
from tests.support import eventually

SPEC = "pipeline.examples.running_totals_avro:app"


def v2_transaction() -> str:
    """The input's next version, BACKWARD-compatible: a field with a default."""
    parsed = json.loads(schema("transaction.avsc"))
    parsed["fields"].append({"name": "currency", "type": "string", "default": "EUR"})
    return json.dumps(parsed)


def started(instance: Instance) -> None:
    """Waits until the instance is past its start-up registry check (its runner's first line)."""
    deadline = time.monotonic() + 60
    while "producers per_" not in (log := instance.log_path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{instance.name} did not start within 60 s:\n{log[-3000:]}"
        time.sleep(0.2)


def _owned_by(run, names: set[str]) -> bool:
    owners = group_owners(run.bootstrap, run.app_id)
    return set(owners) <= names and sorted(p for parts in owners.values() for p in parts) == list(range(PARTITIONS))


def test_exactly_once_with_sigkills_and_the_registry_paused(fault_run, private_schema_registry: SchemaRegistry):
    # A registry of its own: this test runs in both lanes at once, and pausing the shared registry would stall the
    # other lane's tests (and their resume would end this pause early).
    schema_registry = private_schema_registry
    run = fault_run(SPEC, schema_registry_url=schema_registry.url, schema_registry_timeout_ms="1000")
    producer_registry = SchemaRegistryClient({"url": schema_registry.url})  # the input's producer: its own client
    encode_key, encode_v1 = input_encoders(Settings(schema_registry_url=schema_registry.url), producer_registry)
    encode_v2 = AvroSerde(v2_transaction()).bind(producer_registry, run.input_topic, False).serialize
    v1, v2 = [], []
    for i, (partition, key, value, *_) in enumerate(inputs.running_totals_records(16_000, partitions=PARTITIONS)):
        row = json.loads(value)
        if i < 8_000:
            v1.append((partition, encode_key(key.decode()), encode_v1(row)))
        else:  # a version the processes have not seen: its first record asks the registry
            v2.append((partition, encode_key(key.decode()), encode_v2({**row, "currency": "CHF"})))
    run.feed(v1, seconds=6)
    # One after the other: two processes registering the same new output schema at once made Apicurio (H2) hold one
    # of them past this test's 1 s SCHEMA_REGISTRY_TIMEOUT_MS four times over in a CI run, and it exited 2 at start-up.
    fleet = run.start(1)
    started(fleet.alive[0])
    started(fleet.start(1)[0])
    time.sleep(1.5)
    fleet.alive[0].kill()
    [replacement] = fleet.start(1)
    started(replacement)  # past its registry check: a process started while the registry is paused exits 2
    assert run._feeder is not None
    run._feeder.join(60)
    # Every partition owned by a live process and v1 caught up, so that the v2 records find processes that ask the
    # registry. Caught up alone was not enough: in a CI run the killed process had committed all of v1 before it
    # died, and while the registry was paused the group was still waiting for it: nobody read v2 until the resume.
    assert not wait_caught_up(run.bootstrap, run.app_id, run.input_topic, PARTITIONS, 90)
    alive = {instance.name for instance in fleet.alive}
    eventually(lambda: _owned_by(run, alive), timeout_s=60)
    schema_registry.pause()
    try:
        run.feed(v2, seconds=5)  # while the registry does not answer
        time.sleep(3)
        fleet.alive[0].kill()  # killed while it waits for the registry: its open transaction is aborted
        time.sleep(2)
    finally:
        schema_registry.resume()
    [last] = fleet.start(1)
    started(last)
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert outcome.verdict is not None and outcome.verdict.outputs == 16_000
    assert outcome.verdict.dead_letters == 0
    assert "waits for the schema registry" in outcome.logs, "the pause came too late to matter"
