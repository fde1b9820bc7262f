"""Registry serdes (pipeline/registry.py) without servers: the test driver with confluent-kafka's in-memory registry
client. What a registry decides (compatibility, credentials, a registry that stops answering for real) is tested
against the real one in tests/integration/test_registry_real.py."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline import settings as settings_module
from pipeline.app import App, Output
from pipeline.core.configure import configured
from pipeline.core.deadletter import PREFIX, DeadLetter
from pipeline.examples import running_totals_avro
from pipeline.examples.running_totals_avro import app as totals_avro
from pipeline.examples.running_totals_avro import schema
from pipeline.registry import AvroSerde, JsonSchemaSerde, ProtobufSerde, bind, memory_registry, wire_schema_id
from pipeline.registry import serdes as serdes_module
from pipeline.registry.avro_codec import compile_schema, compile_wire
from pipeline.registry.binding import check as registry_check
from pipeline.serde import background_registry_lookups
from pipeline.settings import ConfigError, Settings
from pipeline.testing import driver as driver_module
from pipeline.testing.driver import AppDriver

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "SENTINEL-c0ffee"
REGISTRY_MODULES = ("fastavro", "google.protobuf", "jsonschema", "confluent_kafka.schema_registry", "httpx2", "authlib")


class FlakyRegistry:
    """An in-memory registry client that can stop answering (as a paused registry: a transport error) for a schema
    it has not served yet (what the real client has cached, it serves without asking)."""

    def __init__(self) -> None:
        self.inner = memory_registry()
        self.down = False
        self.served: set[tuple[Any, ...]] = set()
        self.refused = 0  # requests made while down

    def get_schema(self, *args: Any) -> Any:
        from confluent_kafka.schema_registry.common._httpx_compat import httpx

        if self.down and args not in self.served:
            self.refused += 1
            raise httpx.ConnectError("connection refused (test: the registry is down)")
        self.served.add(args)
        return self.inner.get_schema(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HangingRegistry:
    """An in-memory registry client whose look-ups of a schema not served yet hang until the test releases them (a
    registry that accepts the connection and does not answer). Broken loop: the driver's step waits here 10 s."""

    def __init__(self) -> None:
        self.inner = memory_registry()
        self.release = threading.Event()
        self.served: set[tuple[Any, ...]] = set()
        self.asked = self.answered = 0

    def get_schema(self, *args: Any) -> Any:
        if args not in self.served:
            self.asked += 1
            self.release.wait(10)
            self.answered += 1
            self.served.add(args)
        return self.inner.get_schema(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def v2_transaction() -> str:
    """A compatible next version of the input's schema: a field added with a default."""
    parsed = json.loads(schema("transaction.avsc"))
    parsed["fields"].append({"name": "currency", "type": "string", "default": "EUR"})
    return json.dumps(parsed)


def foreign_producer(client: Any, value_schema: str, topic: str = "totals-avro-input") -> tuple[Any, Any]:
    """Key and value encoders of another producer of the input topic (its own serdes, the same registry)."""
    key = AvroSerde(schema("account.avsc")).bind(client, topic, True)
    value = AvroSerde(value_schema).bind(client, topic, False)
    return key.serialize, value.serialize


def test_running_totals_avro_round_trip_in_the_driver_and_the_checker_reads_avro() -> None:
    driver = AppDriver(totals_avro)
    assert driver.send("acct-1", {"id": 1, "amount": 5})[0].value == {"id": 1, "count": 1, "sum": 5}
    assert driver.send("acct-1", {"id": 2, "amount": 7})[0].value == {"id": 2, "count": 2, "sum": 12}
    [produced] = driver.send("acct-2", {"id": 3, "amount": -1})
    assert (produced.key, produced.value) == ("acct-2", {"id": 3, "count": 1, "sum": -1})
    assert driver.verify().ok, driver.verify().summary()


def test_the_wire_format_is_magic_byte_zero_and_the_registered_schema_id() -> None:
    client = memory_registry()
    _, encode_value = foreign_producer(client, schema("transaction.avsc"))
    encoded = encode_value({"id": 1, "amount": 5})
    assert encoded[0] == 0
    assert wire_schema_id(encoded) == client.get_latest_version("totals-avro-input-value").schema_id
    assert wire_schema_id(b"{}") is None and wire_schema_id(b"\x01\x00\x00\x00\x01x") is None


@pytest.mark.parametrize(
    "value",
    [b"\x00\x00\x00\x03\xe7payload", b"\x00\x00\x00\x00\x01\x02", b'{"id": 1, "amount": 5}'],
    ids=["unknown-schema-id", "bytes-not-avro", "no-wire-format"],
)
def test_a_record_that_does_not_decode_is_dead_lettered_as_schema_with_its_id(value: bytes) -> None:
    driver = AppDriver(totals_avro)
    encode_key, encode_value = foreign_producer(driver.schema_registry, schema("transaction.avsc"))
    good_id = wire_schema_id(encode_value({"id": 0, "amount": 0}))
    if value.startswith(b"\x00\x00\x00\x00\x01"):  # the real schema's id, bytes that are no Transaction
        value = b"\x00" + (good_id or 0).to_bytes(4, "big") + b"\x02"
    driver.send_bytes(encode_key("acct-1"), value)
    driver.send("acct-1", {"id": 2, "amount": 7})  # the next one goes on
    [letter] = driver.dead_letters
    assert letter.error_type == "schema" and letter.attempts == 1 and not letter.rejected
    assert letter.value == value  # the bytes as they came, for a replay
    assert letter.schema_id == wire_schema_id(value)
    headers = dict(letter.headers())
    if letter.schema_id is None:
        assert PREFIX + "schema.id" not in headers
    else:
        assert headers[PREFIX + "schema.id"] == str(letter.schema_id).encode()
        assert DeadLetter.from_record(letter.key, letter.value, letter.headers()).schema_id == letter.schema_id
    assert [o.value["id"] for o in driver.outputs] == [2]
    assert driver.verify().ok, driver.verify().summary()


def test_a_registry_that_does_not_answer_is_waited_for_never_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serdes_module, "HOLD_S", 0.0)  # the driver's clock does not move: ask again at once
    registry = FlakyRegistry()
    driver = AppDriver(totals_avro, schema_registry=registry)
    encode_key, encode_value = foreign_producer(registry.inner, schema("transaction.avsc"))
    driver.send_bytes(encode_key("acct-1"), encode_value({"id": 1, "amount": 5}))
    encode_key, encode_v2 = foreign_producer(registry.inner, v2_transaction())  # a new schema id, not cached yet
    registry.down = True
    for i in (2, 3):  # p waits at the first of them; what comes after waits behind it
        driver.send_bytes(encode_key("acct-1"), encode_v2({"id": i, "amount": 10, "currency": "CHF"}))
    assert [o.value["id"] for o in driver.outputs] == [1]
    assert driver.dead_letters == []
    assert driver.committed_offset() == 1  # what came before the wait is committed
    driver.run()  # still down: waits again
    assert driver.dead_letters == [] and len(driver.outputs) == 1
    registry.down = False
    driver.run()
    assert [(o.value["id"], o.value["sum"]) for o in driver.outputs] == [(1, 5), (2, 15), (3, 25)]
    assert driver.dead_letters == []
    assert driver.verify().ok, driver.verify().summary()


def test_after_a_registry_fault_other_partitions_wait_at_once_instead_of_asking_again() -> None:
    registry = FlakyRegistry()
    driver = AppDriver(totals_avro, schema_registry=registry, partitions=3)
    encode_key, encode_v2 = foreign_producer(registry.inner, v2_transaction())  # ids the pipeline has not seen
    registry.down = True
    for p in range(3):
        driver.send_bytes(encode_key(f"acct-{p}"), encode_v2({"id": p, "amount": 1, "currency": "X"}), partition=p)
    assert registry.refused == 1  # the first partition asked; the other two waited without a request
    assert driver.outputs == [] and driver.dead_letters == []


def test_a_look_up_not_answered_yet_does_not_block_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_module, "REGISTRY_LOOKUP_WAIT_S", 0.05)  # how long the driver's step lets it answer
    registry = HangingRegistry()
    driver = AppDriver(totals_avro, schema_registry=registry)
    encode_key, encode_value = foreign_producer(registry.inner, schema("transaction.avsc"))
    driver.send_bytes(encode_key("acct-1"), encode_value({"id": 1, "amount": 5}))
    assert (registry.asked, registry.answered) == (1, 0)  # the step returned while the look-up hangs
    assert driver.outputs == [] and driver.dead_letters == []  # the record waits: neither lost nor dead-lettered
    registry.release.set()
    monkeypatch.setattr(driver_module, "REGISTRY_LOOKUP_WAIT_S", 10.0)  # answered now: the look-ups end at once
    driver.run()
    assert [(o.value["id"], o.value["sum"]) for o in driver.outputs] == [(1, 5)]
    asked = registry.asked
    driver.send_bytes(encode_key("acct-1"), encode_value({"id": 2, "amount": 7}))  # cached: no look-up, no wait
    assert [o.value["sum"] for o in driver.outputs] == [5, 12] and registry.asked == asked
    assert driver.verify().ok, driver.verify().summary()


def test_an_unknown_schema_id_answered_in_the_background_is_dead_lettered_as_schema() -> None:
    registry = HangingRegistry()
    registry.release.set()  # it answers: 404 for the unknown id
    driver = AppDriver(totals_avro, schema_registry=registry)
    encode_key, encode_value = foreign_producer(registry.inner, schema("transaction.avsc"))
    unknown = b"\x00\x00\x00\x03\xe7payload"
    driver.send_bytes(encode_key("acct-1"), unknown)
    driver.send_bytes(encode_key("acct-1"), encode_value({"id": 2, "amount": 7}))
    [letter] = driver.dead_letters
    assert (letter.error_type, letter.schema_id, letter.value) == ("schema", 999, unknown)
    assert [o.value["id"] for o in driver.outputs] == [2]


class RacedRegistry:
    """Another instance registers the same new output subject at the same moment: Apicurio answers this one 409."""

    def __init__(self) -> None:
        self.inner = memory_registry()

    def register_schema(self, subject: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryError

        self.inner.register_schema(subject, schema)  # the other instance's, first
        raise SchemaRegistryError(409, 409, f"An artifact with ID '{subject}' in group 'null' already exists.")

    def test_compatibility(self, *args: Any, **kwargs: Any) -> bool:
        return True  # a new subject (the in-memory client has no compatibility check of its own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_output_subject_registered_by_another_instance_at_the_same_time_is_no_error() -> None:
    app = bind(totals_avro, RacedRegistry())
    registry_check(app, Settings(schema_registry_url="http://registry.example:8081"))  # no ConfigError


def test_a_producer_moving_to_a_compatible_schema_is_read_without_restart() -> None:
    driver = AppDriver(totals_avro)
    encode_key, encode_v1 = foreign_producer(driver.schema_registry, schema("transaction.avsc"))
    _, encode_v2 = foreign_producer(driver.schema_registry, v2_transaction())
    driver.send_bytes(encode_key("acct-1"), encode_v1({"id": 1, "amount": 5}))
    driver.send_bytes(encode_key("acct-1"), encode_v2({"id": 2, "amount": 7, "currency": "CHF"}))
    assert wire_schema_id(encode_v1({"id": 0, "amount": 0})) != wire_schema_id(encode_v2({"id": 0, "amount": 0}))
    assert [o.value for o in driver.outputs] == [{"id": 1, "count": 1, "sum": 5}, {"id": 2, "count": 2, "sum": 12}]
    assert driver.dead_letters == []


def test_an_unbound_registry_serde_says_how_to_bind_it() -> None:
    with pytest.raises(TypeError, match="SCHEMA_REGISTRY_URL"):
        AvroSerde(schema("total.avsc")).serialize({"id": 1, "count": 1, "sum": 1})


def test_configured_binds_the_registry_serdes_and_needs_the_url() -> None:
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_URL is empty"):
        configured(totals_avro, settings_module.load(env={}))
    env = {"PIPELINE_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1", "PIPELINE_TOPIC_SUFFIX": "-x"}
    settings = settings_module.load(env=env)
    app = configured(totals_avro, settings)
    serde = app.output_value_serde
    assert isinstance(serde, AvroSerde) and serde.bound and "totals-avro-output-x" in repr(serde)
    assert app.streams[0].value_serde.bound  # type: ignore[attr-defined]
    assert not totals_avro.output_value_serde.bound  # type: ignore[attr-defined]  # the declared App is unchanged


def test_subject_names_follow_the_strategy() -> None:
    total = schema("total.avsc")
    assert AvroSerde(total).subject("t", False) == "t-value"
    assert AvroSerde(total).subject("t", True) == "t-key"
    assert AvroSerde(total, subject_strategy="record").subject("t", False) == "eos.examples.running_totals.Total"
    topic_record = AvroSerde(total, subject_strategy="topic_record")
    assert topic_record.subject("t", False) == "t-eos.examples.running_totals.Total"
    assert JsonSchemaSerde('{"title": "Fill", "type": "object"}', subject_strategy="record").subject("t", 0) == "Fill"
    with pytest.raises(ValueError, match="subject_strategy"):
        AvroSerde(total, subject_strategy="topic-name")
    with pytest.raises(ValueError, match="version"):
        AvroSerde(total, version=0)
    assert not AvroSerde(total, version="latest").auto_register  # a version of the registry is registered there
    with pytest.raises(ValueError, match="generated message class"):
        ProtobufSerde(None)


def test_a_pinned_version_and_the_latest_write_with_the_registry_s_schema() -> None:
    client = memory_registry()
    v1 = AvroSerde(schema("transaction.avsc")).bind(client, "t", False)
    first = v1.serialize({"id": 1, "amount": 1})
    v2 = AvroSerde(v2_transaction()).bind(client, "t", False)
    second = v2.serialize({"id": 1, "amount": 1, "currency": "CHF"})
    pinned = AvroSerde(version=1).bind(client, "t", False)
    latest = AvroSerde(version="latest").bind(client, "t", False)
    assert wire_schema_id(pinned.serialize({"id": 5, "amount": 5}) or b"") == wire_schema_id(first or b"")
    assert wire_schema_id(latest.serialize({"id": 5, "amount": 5, "currency": "X"}) or b"") == wire_schema_id(
        second or b""
    )
    assert pinned.deserialize(second) == {"id": 1, "amount": 1}  # read as version 1: the new field dropped


def test_json_schema_serde_validates_and_round_trips() -> None:
    fill = '{"title": "Fill", "type": "object", "properties": {"qty": {"type": "integer"}}, "required": ["qty"]}'
    serde = JsonSchemaSerde(fill).bind(memory_registry(), "fills", False)
    assert serde.deserialize(serde.serialize({"qty": 3})) == {"qty": 3}
    with pytest.raises(Exception, match=r"not of type 'integer'"):
        serde.serialize({"qty": "three"})


def test_a_state_serde_cannot_be_a_registry_serde() -> None:
    app = App("a", "in", "out", lambda state, record: [Output(record.value)], state_serde=AvroSerde('"string"'))
    with pytest.raises(ConfigError, match="state_serde"):
        bind(app, memory_registry())


def test_the_core_does_not_load_the_registry_libraries() -> None:
    code = (
        "import sys, pipeline.app, pipeline.service, pipeline.core.configure, pipeline.registry, "
        "pipeline.sinks.kafka.runner, pipeline.testing.driver\n"
        "from pipeline.examples.running_totals import app\n"
        "from pipeline.core.configure import configured\n"
        "from pipeline.settings import Settings\n"
        "configured(app, Settings())\n"
        f"print([m for m in sys.modules if m.startswith({REGISTRY_MODULES!r})])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_registry_user_info_is_a_secret_and_the_url_may_not_carry_credentials() -> None:
    env = {
        "PIPELINE_SCHEMA_REGISTRY_URL": "http://registry.example:8081",
        "PIPELINE_SCHEMA_REGISTRY_USER_INFO": f"svc:{SENTINEL}",
    }
    settings = settings_module.load(env=env)
    for text in (json.dumps(settings.redacted()), repr(settings), str(settings)):
        assert SENTINEL not in text
    assert settings.redacted()["schema_registry_user_info"] == "***"
    assert str(settings.schema_registry_user_info).endswith(SENTINEL)  # the client gets the real value
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_USER_INFO") as refused:
        settings_module.load(env={**env, "PIPELINE_SCHEMA_REGISTRY_URL": f"http://svc:{SENTINEL}@registry.example"})
    assert SENTINEL not in str(refused.value)
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_USER_INFO must be user:password") as malformed:
        settings_module.load(env={**env, "PIPELINE_SCHEMA_REGISTRY_USER_INFO": SENTINEL})
    assert SENTINEL not in str(malformed.value)
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_TIMEOUT_MS"):
        settings_module.load(env={**env, "PIPELINE_SCHEMA_REGISTRY_TIMEOUT_MS": "20000"})
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_URL must be"):
        settings_module.load(env={"PIPELINE_SCHEMA_REGISTRY_URL": "registry.example:8081"})


def test_the_avro_example_ships_its_schemas() -> None:
    shipped = {p.name for p in running_totals_avro.SCHEMAS.glob("*.avsc")}
    assert shipped == {"account.avsc", "transaction.avsc", "total.avsc"}
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"pipeline.examples" = ["schemas/*.avsc"' in pyproject


CODEC_SCHEMAS = [
    "string",
    "long",
    "int",
    "boolean",
    "double",
    {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": f, "type": t}
            for f, t in [("s", "string"), ("l", "long"), ("i", "int"), ("b", "boolean"), ("d", "double")]
        ],
    },
]


LONG_EDGES = (-(2**63), 2**63 - 1)


def random_value(schema: Any, rng: random.Random) -> Any:
    if isinstance(schema, dict):
        return {f["name"]: random_value(f["type"], rng) for f in schema["fields"]}
    return {
        "string": lambda: "".join(rng.choice("aé€😀z ") for _ in range(rng.choice([0, 1, 5, 63, 64, 200]))),
        "long": lambda: rng.choice(
            [0, -1, 1, 63, -64, 64, 2**31, -(2**63), 2**63 - 1, rng.randint(-(2**63), 2**63 - 1)]
        ),
        "int": lambda: rng.choice([0, -1, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)]),
        "boolean": lambda: rng.random() < 0.5,
        "double": lambda: rng.choice([0.0, -1.5, 1e308, rng.uniform(-1e9, 1e9)]),
    }[schema]()


@pytest.mark.parametrize("schema", CODEC_SCHEMAS, ids=lambda s: s if isinstance(s, str) else "record")
def test_the_compiled_avro_codec_writes_and_reads_what_fastavro_does(schema: Any) -> None:
    from fastavro import parse_schema, schemaless_reader, schemaless_writer

    parsed = parse_schema(schema)
    compiled, whole = compile_schema(parsed), compile_wire(parsed, b"\x00\x00\x00\x01\x02")
    assert compiled is not None and whole is not None
    (read, write), (decode, encode) = compiled, whole
    rng = random.Random(7)
    for _ in range(300):
        value = random_value(schema, rng)
        theirs = io.BytesIO()
        schemaless_writer(theirs, parsed, value)
        ours = bytearray()
        write(ours, value)
        assert bytes(ours) == theirs.getvalue(), value
        assert read(bytes(ours), 0) == (schemaless_reader(io.BytesIO(bytes(ours)), parsed, None), len(ours))
        assert encode(value) == b"\x00\x00\x00\x01\x02" + theirs.getvalue()
        assert decode(encode(value)) == read(bytes(ours), 0)[0]


def test_the_compiled_codec_leaves_other_schemas_to_fastavro_and_refuses_wrong_values() -> None:
    from fastavro import parse_schema

    assert compile_schema(parse_schema(["null", "string"])) is None  # a union
    assert compile_schema(parse_schema({"type": "array", "items": "long"})) is None
    with_default = {"type": "record", "name": "D", "fields": [{"name": "c", "type": "string", "default": "EUR"}]}
    assert compile_schema(parse_schema(with_default)) is None  # fastavro fills the default in
    _, write = compile_schema(parse_schema("long")) or (None, None)
    assert write is not None
    for wrong in ("1", 2**63, 1.0):
        with pytest.raises(ValueError, match="not an Avro long"):
            write(bytearray(), wrong)


def test_registry_look_ups_wait_in_the_background_for_records_and_run_inline_for_timers() -> None:
    """A record can wait at its offset for a look-up (RegistryPending); a firing timer has no offset to wait at."""
    seen: list[tuple[str, bool]] = []

    def schedule(state: Any, record: Any) -> list[Output]:
        seen.append(("process", background_registry_lookups.get()))
        state.timers.schedule(record.key, record.timestamp_ms + 10)
        return []

    def fired(state: Any, timer: Any) -> list[Output]:
        seen.append(("on_timer", background_registry_lookups.get()))
        return []

    driver = AppDriver(App("reminders", "in", "out", schedule, on_timer=fired))
    driver.send("a", 1, timestamp_ms=0)
    driver.send("b", 1, timestamp_ms=20)
    assert seen == [("process", True), ("on_timer", False), ("process", True)]  # due before the record at 20


class RacedWith500:
    """Two instances register the same new output schema at once: Apicurio (H2 storage) answers one of them 500,
    a unique-key violation on its content table (seen in CI: the instance stopped at start-up)."""

    def __init__(self, failures: int) -> None:
        self.inner = memory_registry()
        self.failures = failures

    def register_schema(self, subject: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryError

        if self.failures:
            self.failures -= 1
            raise SchemaRegistryError(500, 0, "JdbcSQLIntegrityConstraintViolationException: Unique index violation")
        return self.inner.register_schema(subject, schema, *args, **kwargs)

    def test_compatibility(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_5xx_at_start_up_is_asked_again_and_a_registry_that_keeps_failing_stops_the_start() -> None:
    """Red before: the first 500 stopped the start with a ConfigError."""
    settings = Settings(schema_registry_url="http://registry.example:8081")
    registry_check(bind(totals_avro, RacedWith500(failures=1)), settings)  # no ConfigError
    with pytest.raises(ConfigError, match="SCHEMA_REGISTRY_URL"):
        registry_check(bind(totals_avro, RacedWith500(failures=100)), settings)
