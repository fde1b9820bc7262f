"""What the Kafka sink's hot loop (KafkaTask._process) reads per record, prepared once per task: how inputs are
decoded and outputs encoded, with as few Python calls per record as the serdes allow (issue 33: the per-record cost
above the same work written by hand).

A serde with a C twin (pipeline/serde.py: fast_deserialize, fast_serialize; STRING and JSON) is not called per
record: its twin is, and only what the twin refuses (None, bytes or values the serde itself would refuse or treat
otherwise) is asked of the serde, which gives its own answer or its own error. So the values and errors are the
serdes' own, at a C call each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from pipeline.app import DEAD_LETTERS, App, Output
from pipeline.core.lifecycle import Phase
from pipeline.serde import fast_deserialize, fast_serialize, identity, skip_bytes_deserialize, skip_bytes_serialize

# An output as the producer takes it: (topic, key bytes, value bytes, partition or -1, headers).
Encoded = tuple[str, Any, Any, int, Any]
RUNNING = Phase.RUNNING  # a module global: an Enum member looked up on its class costs ~0.1 us, per record
new_record = tuple.__new__  # new_record(Record, fields): a Record without the Python frame of its __new__
NO_ERROR: tuple[type[Exception], ...] = ()  # `except NO_ERROR` catches nothing


class HotPath(NamedTuple):
    """The input's name; how keys and values are decoded (None: bytes passed through); what a failed decode is
    caught as to ask the serdes again (Exception with C twins; NO_ERROR without: the error is the serde's own); and
    how outputs are encoded. A tuple: the loop unpacks it once per batch."""

    name: str
    decode_key: Callable[[Any], Any] | None
    decode_value: Callable[[Any], Any] | None
    twin_failed: type[Exception] | tuple[type[Exception], ...]
    encode: Callable[[Output], Encoded]

    @classmethod
    def of(cls, app: App, encode: Callable[[Output], Encoded]) -> HotPath:
        stream = app.streams[0]  # its serdes, not the App's: App(inputs=[Stream(t, BYTES, BYTES)]) has one input too
        own = skip_bytes_deserialize(stream.key_serde), skip_bytes_deserialize(stream.value_serde)
        fast = fast_deserialize(stream.key_serde), fast_deserialize(stream.value_serde)
        # Twins only when every side that decodes has one: a serde without one is called once per record, never again.
        if any(own) and all(f is not None for f, o in zip(fast, own, strict=True) if o is not None):
            twins = (fast[0] if own[0] else None, fast[1] if own[1] else None)
            return cls(stream.name, *twins, Exception, encode)
        return cls(stream.name, *own, NO_ERROR, encode)


def encoder(app: App, output_topic: str, held: Callable[[Output], Encoded]) -> Callable[[Output], Encoded]:
    """Output -> Encoded with the App's output serdes; an output that dead-letters a held record (app.dead_letter)
    -> `held(output)`, the dead letter."""
    encode_key = skip_bytes_serialize(app.output_key_serde)
    encode_value = skip_bytes_serialize(app.output_value_serde)
    if encode_key is None and encode_value is None:
        return lambda o: (
            held(o)
            if o.topic is DEAD_LETTERS
            else (o.topic or output_topic, o.key, o.value, -1 if o.partition is None else o.partition, o.headers)
        )
    key_of, value_of = encode_key or identity, encode_value or identity
    fast_key, fast_value = fast_serialize(app.output_key_serde), fast_serialize(app.output_value_serde)
    if fast_key is not None and fast_value is not None:
        return twin_encoder(output_topic, held, (fast_key, fast_value), (key_of, value_of))
    return lambda o: (
        held(o)
        if o.topic is DEAD_LETTERS
        else (
            o.topic or output_topic,
            key_of(o.key),
            value_of(o.value),
            -1 if o.partition is None else o.partition,
            o.headers,
        )
    )


def twin_encoder(
    output_topic: str,
    held: Callable[[Output], Encoded],
    fast: tuple[Callable[[Any], Any], Callable[[Any], Any]],
    own: tuple[Callable[[Any], bytes | None], Callable[[Any], bytes | None]],
) -> Callable[[Output], Encoded]:
    """Both output serdes have C twins: they are called directly, None is written as None (as the serdes write it),
    and whatever a twin refuses is asked again of the serdes (their bytes, or their error)."""
    fast_key, fast_value = fast
    key_of, value_of = own

    def encode(o: Output) -> Encoded:
        if o.topic is DEAD_LETTERS:
            return held(o)
        key, value = o.key, o.value
        try:
            out_key = None if key is None else fast_key(key)
            out_value = None if value is None else fast_value(value)
        except Exception:
            out_key, out_value = key_of(key), value_of(value)
        return (o.topic or output_topic, out_key, out_value, -1 if o.partition is None else o.partition, o.headers)

    return encode
