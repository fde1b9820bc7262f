"""Registry serdes against the real Schema Registry (tests/plugins/registry.py) and broker: interop with
confluent-kafka's own deserializers (Avro and Protobuf), the start-up errors, an incompatible output schema, schemas
fetched once per id, poison records dead-lettered as `schema`, and a registry paused while a pipeline runs."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipeline import settings as settings_module
from pipeline.app import App, Output, Record, State
from pipeline.core.deadletter import DeadLetter
from pipeline.examples.running_totals import process as totals_process
from pipeline.examples.running_totals_avro import app as totals_avro
from pipeline.examples.running_totals_avro import input_encoders, schema
from pipeline.registry import AvroSerde, ProtobufSerde, client_for
from pipeline.service import check_registry
from pipeline.settings import ConfigError, Settings
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing import checker, inputs
from pipeline.testing.harness import wait_caught_up
from tests.integration.test_restore import running
from tests.plugins.registry import SchemaRegistry
from tests.protos.total_pb2 import Total  # type: ignore[attr-defined]
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "SENTINEL-c0ffee"
AVRO_SPEC = "pipeline.examples.running_totals_avro:app"


def fresh(bootstrap: str, app: App, partitions: int = 1) -> tuple[App, str]:
    """The App on fresh topics (fresh subjects too: topic strategy), and a fresh app id."""
    suffix = uuid.uuid4().hex[:8]
    app = app.with_topics(f"reg-in-{suffix}", f"reg-out-{suffix}")
    inputs.create_topics(bootstrap, {app.input_topic: partitions, app.output_topic: partitions})
    return app, f"reg-{suffix}"


def config(bootstrap: str, app_id: str, registry_url: str, **overrides: Any) -> Settings:
    return settings_module.load(
        env={},
        bootstrap_servers=bootstrap,
        app_id=app_id,
        schema_registry_url=registry_url,
        processing_backoff_ms=50,
        **overrides,
    )


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, value, key, partition=0)
    producer.flush(30)


def read_all(bootstrap: str, topic: str, count: int, timeout_s: float = 60) -> list[Any]:
    """`count` committed records of `topic` (read_committed), as confluent-kafka messages."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count and time.monotonic() < deadline:
            found += [m for m in consumer.consume(500, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return found


def expected_totals(records: list[tuple[str, int, int]]) -> list[dict[str, int]]:
    """running_totals over (account, id, amount), in input order (one partition)."""
    totals: dict[str, tuple[int, int]] = {}
    out = []
    for account, i, amount in records:
        count, total = totals.get(account, (0, 0))
        totals[account] = (count + 1, total + amount)
        out.append({"id": i, "count": count + 1, "sum": total + amount})
    return out


class CountingTransport:
    """Counts the HTTP requests a registry client sends (its httpx session's `request`)."""

    def __init__(self, client: Any) -> None:
        self.session = client._rest_client.session
        self.original = self.session.request
        self.count = 0
        self.session.request = self._request

    def _request(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.original(*args, **kwargs)

    def close(self) -> None:
        self.session.request = self.original


# -- interop, schemas once per id, dead letters -------------------------------------------------------------------
def test_avro_outputs_are_read_by_confluent_kafka_s_own_deserializer(kafka_bootstrap, schema_registry_url):
    app, app_id = fresh(kafka_bootstrap, totals_avro)
    settings = config(kafka_bootstrap, app_id, schema_registry_url)
    producer_registry = SchemaRegistryClient({"url": schema_registry_url})
    encode_key, encode_value = input_encoders(settings, producer_registry)
    rows = [(f"acct-{i % 5}", i, i * 3 - 7) for i in range(300)]
    unknown_id = b"\x00" + (2**31 - 5).to_bytes(4, "big") + b"\x02"
    records = [(encode_key(a), encode_value({"id": i, "amount": amount})) for a, i, amount in rows[:150]]
    records += [(encode_key("acct-x"), unknown_id), (encode_key("acct-y"), b"\x00\x00\x00\x00")]  # two poison
    records += [(encode_key(a), encode_value({"id": i, "amount": amount})) for a, i, amount in rows[150:]]
    produce(kafka_bootstrap, app.input_topic, records)

    runner = KafkaRunner(app, settings)
    counted = CountingTransport(client_for(settings))
    try:
        with running(runner):
            assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 90)
    finally:
        counted.close()
    # Per run, not per record: the start-up check, the two subjects' registrations and a look-up per schema id
    # (the key's, the value's, the unknown one) — 302 records went through.
    assert counted.count <= 12, counted.count

    theirs = AvroDeserializer(SchemaRegistryClient({"url": schema_registry_url}))
    messages = read_all(kafka_bootstrap, app.output_topic, 300)
    values = [theirs(m.value(), SerializationContext(m.topic(), MessageField.VALUE)) for m in messages]
    keys = [theirs(m.key(), SerializationContext(m.topic(), MessageField.KEY)) for m in messages]
    assert values == expected_totals(rows)
    assert keys == [a for a, _, _ in rows]

    letters = [
        DeadLetter.from_record(m.key(), m.value(), m.headers()) for m in read_all(kafka_bootstrap, f"{app_id}-dlq", 2)
    ]
    assert [(d.error_type, d.schema_id, d.value) for d in letters] == [
        ("schema", 2**31 - 5, unknown_id),
        ("schema", None, b"\x00\x00\x00\x00"),
    ]
    verdict = checker.verify(
        app,
        kafka_bootstrap,
        dead_letter_topic=f"{app_id}-dlq",
        changelog_topic=f"{app_id}-changelog",
        group_id=app_id,
        schema_registry=SchemaRegistryClient({"url": schema_registry_url}),
    )
    assert verdict.ok, verdict.summary()


def protobuf_totals(state: State, record: Record) -> Iterable[Output]:
    """running_totals with a Protobuf output (a generated message class: tests/protos/total_pb2.py)."""
    return [o._replace(value=Total(**o.value)) for o in totals_process(state, record)]


def test_protobuf_outputs_are_read_by_confluent_kafka_s_own_deserializer(kafka_bootstrap, schema_registry_url):
    declared = App("reg-protobuf", "in", "out", protobuf_totals, output_value_serde=ProtobufSerde(Total))
    app, app_id = fresh(kafka_bootstrap, declared)
    rows = [(f"acct-{i % 4}", i, i + 1) for i in range(100)]
    records = [(a.encode(), json.dumps({"id": i, "amount": amount}).encode()) for a, i, amount in rows]
    produce(kafka_bootstrap, app.input_topic, records)
    with running(KafkaRunner(app, config(kafka_bootstrap, app_id, schema_registry_url))):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 90)

    theirs = ProtobufDeserializer(Total, {}, SchemaRegistryClient({"url": schema_registry_url}))
    messages = read_all(kafka_bootstrap, app.output_topic, 100)
    decoded = [theirs(m.value(), SerializationContext(m.topic(), MessageField.VALUE)) for m in messages]
    assert [{"id": t.id, "count": t.count, "sum": t.sum} for t in decoded] == expected_totals(rows)
    registered = SchemaRegistryClient({"url": schema_registry_url}).get_latest_version(f"{app.output_topic}-value")
    assert registered.schema.schema_type == "PROTOBUF"


# -- start-up -----------------------------------------------------------------------------------------------------
def pipeline_run(spec: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run", spec],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_an_unreachable_registry_at_start_up_is_one_error_naming_the_setting_exit_2(kafka_bootstrap):
    result = pipeline_run(
        AVRO_SPEC,
        {"PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap, "PIPELINE_SCHEMA_REGISTRY_URL": "http://127.0.0.1:9/apis"},
    )
    assert result.returncode == 2, result.stderr
    assert "configuration error: SCHEMA_REGISTRY_URL=http://127.0.0.1:9/apis: the schema registry did not answer" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_pipeline_verify_names_an_unreachable_registry_before_it_reads(kafka_bootstrap):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env = {"PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap, "PIPELINE_SCHEMA_REGISTRY_URL": "http://127.0.0.1:9"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "verify", AVRO_SPEC],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "SCHEMA_REGISTRY_URL=http://127.0.0.1:9: the schema registry did not answer" in result.stderr


def test_a_paused_registry_at_start_up_times_out_into_the_same_error(kafka_bootstrap, private_schema_registry):
    # A registry of its own: pausing the shared one would stall the other lane's tests, and their resume end this pause.
    schema_registry = private_schema_registry
    schema_registry.pause()
    try:
        env = {
            "PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "PIPELINE_SCHEMA_REGISTRY_URL": schema_registry.url,
            "PIPELINE_SCHEMA_REGISTRY_TIMEOUT_MS": "1000",
        }
        result = pipeline_run(AVRO_SPEC, env)
    finally:
        schema_registry.resume()
    assert result.returncode == 2, result.stderr
    assert "SCHEMA_REGISTRY_TIMEOUT_MS=1000" in result.stderr and "did not answer" in result.stderr


class Refusing(http.server.BaseHTTPRequestHandler):
    """A registry front that refuses every request's credentials (the local Apicurio runs without authentication)."""

    def do_GET(self) -> None:
        body = b'{"error_code": 40101, "message": "Unauthorized"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def refusing_registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_refused_credentials_at_start_up_name_the_setting_and_never_show_them(kafka_bootstrap, refusing_registry):
    env = {
        "PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PIPELINE_SCHEMA_REGISTRY_URL": refusing_registry,
        "PIPELINE_SCHEMA_REGISTRY_USER_INFO": f"svc:{SENTINEL}",
    }
    result = pipeline_run(AVRO_SPEC, env)
    assert result.returncode == 2, result.stderr
    assert "SCHEMA_REGISTRY_USER_INFO: the schema registry at" in result.stderr
    assert "refused the credentials (HTTP 401)" in result.stderr
    assert SENTINEL not in result.stderr + result.stdout


def test_an_output_schema_incompatible_with_its_subject_is_refused_at_start_up(kafka_bootstrap, schema_registry_url):
    app, app_id = fresh(kafka_bootstrap, totals_avro)
    settings = config(kafka_bootstrap, app_id, schema_registry_url)
    check_registry(app, settings)  # registers Total v1 under the output's subject
    broken = json.loads(schema("total.avsc"))
    broken["fields"].append({"name": "currency", "type": "string"})  # no default: BACKWARD refuses it
    changed = replace(app, output_value_serde=AvroSerde(json.dumps(broken)))
    with pytest.raises(ConfigError, match=rf"subject '{app.output_topic}-value' under the subject's compatibility"):
        check_registry(changed, settings)
    compatible = json.loads(schema("total.avsc"))
    compatible["fields"].append({"name": "currency", "type": "string", "default": "EUR"})
    check_registry(replace(app, output_value_serde=AvroSerde(json.dumps(compatible))), settings)
    versions = SchemaRegistryClient({"url": schema_registry_url}).get_versions(f"{app.output_topic}-value")
    assert len(versions) == 2


# -- a registry paused while the pipeline runs -------------------------------------------------------------------
def v2_transaction() -> str:
    parsed = json.loads(schema("transaction.avsc"))
    parsed["fields"].append({"name": "currency", "type": "string", "default": "EUR"})
    return json.dumps(parsed)


def test_a_registry_paused_while_running_is_waited_for_and_a_new_schema_is_read_without_restart(
    kafka_bootstrap, private_schema_registry: SchemaRegistry
):
    schema_registry = private_schema_registry  # paused: a registry of its own (the shared one serves both lanes)
    app, app_id = fresh(kafka_bootstrap, totals_avro)
    settings = config(kafka_bootstrap, app_id, schema_registry.url, schema_registry_timeout_ms=1_000)
    theirs = SchemaRegistryClient({"url": schema_registry.url})  # another producer: its own client and cache
    encode_key, encode_v1 = input_encoders(settings, theirs)
    v2 = AvroSerde(v2_transaction()).bind(theirs, app.input_topic, False)  # BACKWARD: the registry accepts it
    rows = [(f"acct-{i % 3}", i, i) for i in range(200)]
    first = [(encode_key(a), encode_v1({"id": i, "amount": n})) for a, i, n in rows[:100]]
    later = [(encode_key(a), v2.serialize({"id": i, "amount": n, "currency": "CHF"})) for a, i, n in rows[100:]]
    theirs.get_latest_version(f"{app.input_topic}-value")  # v2 is registered: a new id the pipeline has not seen
    produce(kafka_bootstrap, app.input_topic, first)
    runner = KafkaRunner(app, settings)
    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 90)
        schema_registry.pause()
        try:
            produce(kafka_bootstrap, app.input_topic, later)
            eventually(lambda: runner.metrics.processing_errors.labels("0")._value.get() >= 1, 60, 0.2)
            time.sleep(2)  # several waits while paused: the loop polls on, nothing dead-lettered
            assert runner.consumer is not None and runner.consumer.memberid()
        finally:
            schema_registry.resume()
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 90)
    values = [m.value() for m in read_all(kafka_bootstrap, app.output_topic, 200)]
    decoded = [AvroDeserializer(theirs)(v, SerializationContext(app.output_topic, MessageField.VALUE)) for v in values]
    assert decoded == expected_totals(rows)
    verdict = checker.verify(
        app,
        kafka_bootstrap,
        dead_letter_topic=f"{app_id}-dlq",
        changelog_topic=f"{app_id}-changelog",
        group_id=app_id,
        schema_registry=theirs,
    )
    assert verdict.ok, verdict.summary()
    assert verdict.dead_letters == 0 and verdict.outputs == 200, verdict.summary()


def test_registry_credentials_stay_out_of_the_log_and_the_metrics_of_a_run_at_debug(
    kafka_bootstrap, schema_registry_url, tmp_path
):
    app, app_id = fresh(kafka_bootstrap, totals_avro)
    settings = config(kafka_bootstrap, app_id, schema_registry_url)
    encode_key, encode_value = input_encoders(settings, SchemaRegistryClient({"url": schema_registry_url}))
    records = [(encode_key(f"acct-{i % 3}"), encode_value({"id": i, "amount": i})) for i in range(50)]
    produce(kafka_bootstrap, app.input_topic, [*records, (encode_key("acct-0"), b"\x00\x7f\xff\xff\xf0x")])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env = {
        **clean,
        "PYTHONPATH": str(ROOT),
        "PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": app.input_topic,
        "PIPELINE_OUTPUT_TOPIC": app.output_topic,
        "PIPELINE_SCHEMA_REGISTRY_URL": schema_registry_url,
        "PIPELINE_SCHEMA_REGISTRY_USER_INFO": f"svc:{SENTINEL}",  # sent as basic auth; the local registry ignores it
        "PIPELINE_METRICS_PORT": "19471",
    }
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--log-level", "debug", "run", AVRO_SPEC],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 90), log_path.read_text()[-3000:]
        with urllib.request.urlopen("http://127.0.0.1:19471/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        process.terminate()
        process.wait(30)
    text = log_path.read_text()
    assert "dead-lettered" in text and "SchemaError" in text  # the poison record's error went through the log
    assert SENTINEL not in text
    assert SENTINEL not in metrics and "pipeline_dead_letters_total" in metrics
