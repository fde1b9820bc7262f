"""The Schema Registry the tests get is a real one, and behaves as the serdes and the README count on: confluent-kafka's
own SchemaRegistryClient registers, lists and checks schemas against it; the global rule is BACKWARD from the start;
a schema that breaks it is refused with HTTP 409 (Apicurio answers error_code 0 where Confluent's registry says
409/409); a soft-deleted subject is hidden; the local registry keeps its schemas across a restart."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.plugins.registry import SchemaRegistry

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


def test_the_fixtures_pid_is_the_registrys_java_process(schema_registry: SchemaRegistry) -> None:
    """What pause() signals: the java process that answers on the URL's port (not registry.sh, long gone)."""
    if schema_registry.pid is None:
        pytest.skip("SCHEMA_REGISTRY_URL names an external registry: no local process")
    cmdline = Path(f"/proc/{schema_registry.pid}/cmdline").read_bytes().split(b"\0")
    assert Path(cmdline[0].decode()).name == "java" and any(arg.endswith(b"-runner.jar") for arg in cmdline)
    port = schema_registry.url.split(":")[2].split("/")[0]
    listening = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    assert f"pid={schema_registry.pid}," in listening.stdout


def test_a_paused_registry_does_not_answer_until_resumed(private_schema_registry: SchemaRegistry) -> None:
    """The switch the fault tests use to take the registry away mid-run (SIGSTOP: connections accepted, no answer)."""
    subject = f"test-registry-{uuid.uuid4().hex[:12]}-value"
    impatient = SchemaRegistryClient({"url": private_schema_registry.url, "timeout": 2, "max.retries": 0})
    private_schema_registry.pause()
    try:
        with pytest.raises(Exception) as unanswered:  # httpx's or httpx2's, whichever the client was installed with
            impatient.register_schema(subject, avro(V1))
        assert "Timeout" in type(unanswered.value).__name__, repr(unanswered.value)
    finally:
        private_schema_registry.resume()
    assert impatient.register_schema(subject, avro(V1)) > 0


def test_the_local_registry_keeps_its_schemas_and_rule_across_a_restart(
    private_schema_registry: SchemaRegistry,
) -> None:
    subject = f"test-registry-{uuid.uuid4().hex[:12]}-value"
    schema_id = SchemaRegistryClient({"url": private_schema_registry.url}).register_schema(subject, avro(V1))
    private_schema_registry.restart()
    after = SchemaRegistryClient({"url": private_schema_registry.url})
    assert after.get_subjects() == [subject]
    assert after.get_latest_version(subject).schema_id == schema_id
    assert after.get_compatibility() == "BACKWARD"
