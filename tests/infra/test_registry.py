"""The Schema Registry the tests get is a real one, and behaves as the serdes and the README count on: confluent-kafka's
own SchemaRegistryClient registers, lists and checks schemas against it; the global rule is BACKWARD from the start;
a schema that breaks it is refused with HTTP 409 (Apicurio answers error_code 0 where Confluent's registry says
409/409); a soft-deleted subject is hidden; the local registry keeps its schemas across a restart."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.plugins.registry import REGISTRY_SH, SchemaRegistry

V1 = {"type": "record", "name": "Total", "fields": [{"name": "account", "type": "string"}]}
# BACKWARD: a reader of V2 reads V1's records (the new field has a default); BROKEN's new field has none.
V2 = {**V1, "fields": [*V1["fields"], {"name": "cents", "type": "long", "default": 0}]}
BROKEN = {**V1, "fields": [*V1["fields"], {"name": "cents", "type": "long"}]}


def avro(schema: dict) -> Schema:
    return Schema(json.dumps(schema), schema_type="AVRO")


@pytest.fixture
def client(schema_registry_url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": schema_registry_url})


@pytest.fixture
def subject() -> str:
    return f"test-registry-{uuid.uuid4().hex[:12]}-value"


def test_a_registered_schema_is_listed_and_read_back_by_id(
    client: SchemaRegistryClient, subject: str, schema_registry_url: str
) -> None:
    schema_id = client.register_schema(subject, avro(V1))
    assert subject in client.get_subjects()
    latest = client.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (schema_id, 1)
    fresh = SchemaRegistryClient({"url": schema_registry_url})  # no cache: the registry's own answer
    assert json.loads(fresh.get_schema(schema_id).schema_str) == V1


def test_the_global_rule_is_backward_from_the_start(client: SchemaRegistryClient) -> None:
    assert client.get_compatibility() == "BACKWARD"


def test_a_schema_that_breaks_backward_is_refused_with_409(client: SchemaRegistryClient, subject: str) -> None:
    client.register_schema(subject, avro(V1))
    assert client.test_compatibility(subject, avro(BROKEN)) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, avro(BROKEN))
    assert refused.value.http_status_code == 409
    assert refused.value.error_code == 0  # Apicurio's; Confluent's registry answers 409 here
    assert client.get_versions(subject) == [1]


def test_a_compatible_schema_becomes_the_next_version(client: SchemaRegistryClient, subject: str) -> None:
    first = client.register_schema(subject, avro(V1))
    assert client.test_compatibility(subject, avro(V2)) is True
    second = client.register_schema(subject, avro(V2))
    assert second != first
    assert client.get_versions(subject) == [1, 2]


def test_a_soft_deleted_subject_is_hidden_and_a_second_soft_delete_is_refused(
    client: SchemaRegistryClient, subject: str
) -> None:
    client.register_schema(subject, avro(V1))
    assert client.delete_subject(subject) == [1]
    assert subject not in client.get_subjects()
    with pytest.raises(SchemaRegistryError) as again:
        client.delete_subject(subject)
    assert again.value.http_status_code == 400  # Apicurio's answer; Confluent's registry answers 404


def test_a_paused_registry_does_not_answer_until_resumed(schema_registry: SchemaRegistry, subject: str) -> None:
    """The switch the fault tests use to take the registry away mid-run (SIGSTOP: connections accepted, no answer)."""
    impatient = SchemaRegistryClient({"url": schema_registry.url, "timeout": 2, "max.retries": 0})
    schema_registry.pause()
    try:
        with pytest.raises(Exception) as unanswered:  # httpx's or httpx2's, whichever the client was installed with
            impatient.register_schema(subject, avro(V1))
        assert "Timeout" in type(unanswered.value).__name__, repr(unanswered.value)
    finally:
        schema_registry.resume()
    assert impatient.register_schema(subject, avro(V1)) > 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A second local registry of its own (port, run dir), so that restarting it disturbs no other test."""
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        pytest.skip("SCHEMA_REGISTRY_URL names an external registry: the local one's storage is not under test")
    env = {**os.environ, "REGISTRY_PORT": str(free_port()), "PIPELINE_RUN_DIR": str(tmp_path)}
    yield env
    subprocess.run([str(REGISTRY_SH), "stop"], env=env, check=True, capture_output=True, timeout=60)


def test_the_local_registry_keeps_its_schemas_across_a_restart(own_registry: dict[str, str]) -> None:
    def registry_sh(*args: str) -> str:
        done = subprocess.run([str(REGISTRY_SH), *args], env=own_registry, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    registry_sh("start")
    url = registry_sh("url")
    subject = f"test-registry-{uuid.uuid4().hex[:12]}-value"
    schema_id = SchemaRegistryClient({"url": url}).register_schema(subject, avro(V1))
    registry_sh("stop")
    registry_sh("start")
    after = SchemaRegistryClient({"url": url})
    assert after.get_subjects() == [subject]
    assert after.get_latest_version(subject).schema_id == schema_id
    assert after.get_compatibility() == "BACKWARD"
