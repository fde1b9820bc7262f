"""Running totals per account, as running_totals, on Avro topics behind a schema registry (pipeline/registry.py).

Input: key = account id (Avro "string"), value = Transaction {id, amount} (schemas/transaction.avsc).
Output (same key): Total {id, count, sum} after this record (schemas/total.avsc). State per account: [count, sum].
Both in the Confluent wire format; SCHEMA_REGISTRY_URL names the registry (README: "Avro and Protobuf topics").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from pipeline.app import App
from pipeline.examples.running_totals import process
from pipeline.registry import AvroSerde, RegistrySerde, client_for
from pipeline.settings import Settings
from pipeline.testing.inputs import running_totals_records

SCHEMAS = Path(__file__).with_name("schemas")  # shipped with the package (pyproject.toml: package-data)


def schema(name: str) -> str:
    """An .avsc file of schemas/ as text."""
    return (SCHEMAS / name).read_text()


def generate(n: int, partitions: int, seed: int) -> Iterator[tuple[int, bytes, bytes]]:
    """running_totals' sample input (`pipeline chaos`), encoded in Avro with the registry of SCHEMA_REGISTRY_URL
    (PIPELINE_SCHEMA_REGISTRY_URL in the environment). The writer schema is registered under the App's declared input
    topic's subjects; readers find it by its id, whatever the topic's suffix."""
    encode_key, encode_value = input_encoders(Settings.load())
    for partition, key, value, *_ in running_totals_records(n, partitions=partitions, seed=seed):
        yield partition, encode_key(key.decode()), encode_value(orjson.loads(value))


Encoders = tuple[Callable[[Any], bytes], Callable[[Any], bytes]]
_encoders: dict[tuple[str, str], Encoders] = {}


def input_encoders(settings: Settings, client: Any = None) -> Encoders:
    """(key, value) -> Avro bytes in the wire format, as a producer of this App's input writes them: with `client`,
    or the registry client of SCHEMA_REGISTRY_URL (one per registry: the schema is registered once)."""
    if client is not None:
        return _bound_encoders(client)
    where = (settings.schema_registry_url, str(settings.schema_registry_user_info))
    if where not in _encoders:
        _encoders[where] = _bound_encoders(client_for(settings))
    return _encoders[where]


def _bound_encoders(client: Any) -> Encoders:
    stream = app.streams[0]
    key, value = stream.key_serde, stream.value_serde
    assert isinstance(key, RegistrySerde) and isinstance(value, RegistrySerde)
    bound_key, bound_value = key.bind(client, stream.topic, True), value.bind(client, stream.topic, False)
    return _required(bound_key.serialize), _required(bound_value.serialize)


def _required(serialize: Callable[[Any], bytes | None]) -> Callable[[Any], bytes]:
    def encode(obj: Any) -> bytes:
        encoded = serialize(obj)
        assert encoded is not None
        return encoded

    return encode


app = App(
    name="running-totals-avro",
    input_topic="totals-avro-input",
    output_topic="totals-avro-output",
    process=process,  # running_totals' own: the Avro records decode to the same dicts (id and amount as ints)
    key_serde=AvroSerde(schema("account.avsc")),
    value_serde=AvroSerde(schema("transaction.avsc")),
    output_key_serde=AvroSerde(schema("account.avsc")),
    output_value_serde=AvroSerde(schema("total.avsc")),
    generate=generate,
)
