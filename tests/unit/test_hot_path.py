"""The Kafka sink's hot loop calls the serdes' C twins (pipeline/sinks/kafka/hot.py): what it decodes, encodes and
stores must be what the serdes themselves give, values and errors alike (issue 33)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pytest

from pipeline.app import App, Output, Record, State
from pipeline.examples import running_totals
from pipeline.serde import JSON, STRING, JsonSerde, StringSerde, fast_deserialize, fast_serialize
from pipeline.state import PartitionState
from pipeline.testing.driver import AppDriver

VALUES: list[Any] = ["", "text", "ünïcödé", 0, -5, 2**63 - 1, 1.5, True, [1, "a", None], {"a": {"b": [1, 2]}}]
REFUSED: list[Any] = [2**70, Decimal("1.5"), object()]  # by JsonSerde: the twin must refuse them too


@pytest.mark.parametrize("serde", [STRING, JSON], ids=["string", "json"])
def test_a_twin_gives_the_serdes_bytes_and_values_or_raises(serde: StringSerde | JsonSerde) -> None:
    dumps, loads = fast_serialize(serde), fast_deserialize(serde)
    assert dumps is not None and loads is not None
    for value in VALUES if serde is JSON else [v for v in VALUES if isinstance(v, str)]:
        assert dumps(value) == serde.serialize(value)
        assert loads(serde.serialize(value)) == serde.deserialize(serde.serialize(value))
    for refused in (None, b"\xff\xfe not utf-8 {"):  # the hot path then asks the serde itself
        with pytest.raises(Exception):  # noqa: B017 - any error: the caller falls back on every one
            loads(refused)
    for value in REFUSED if serde is JSON else [None, 5]:
        with pytest.raises(Exception):  # noqa: B017
            dumps(value)


def test_serdes_that_decode_otherwise_have_no_twin() -> None:
    class Upper(StringSerde):
        def deserialize(self, data: bytes | None) -> Any:
            return None if data is None else data.decode().upper()

    assert fast_deserialize(JsonSerde(decimal=True)) is None and fast_serialize(JsonSerde(decimal=True)) is None
    assert fast_deserialize(Upper()) is None  # a subclass may decode otherwise: its own call, never a twin


def _echo(state: State, record: Record) -> Iterable[Output]:
    """Writes back what it read: its value, and the state's stored value of the key."""
    state[record.key] = {"seen": record.value}
    return (Output(key=record.key, value=record.value),)


ECHO = App(name="echo", input_topic="echo-in", output_topic="echo-out", process=_echo)


def test_a_null_value_reaches_process_as_none_and_leaves_as_a_tombstone() -> None:
    driver = AppDriver(ECHO, processing_max_attempts=1)
    driver.send_bytes(b"k", None)
    assert not driver.dead_letters  # the JSON twin refused None: the serde's own call gave None, no failure
    (out,) = [r for topic, r in driver.broker.produced if topic == ECHO.output_topic]
    assert out.value is None  # None is the tombstone, as JsonSerde writes it (never b"null")
    assert out.key == b"k"


def test_a_record_the_twin_refuses_is_dead_lettered_with_the_serdes_own_error() -> None:
    driver = AppDriver(running_totals.app, processing_max_attempts=1)
    driver.send_bytes(b"account-1", b'{"id": 1, "amount": ')  # cut off: not JSON
    (letter,) = driver.dead_letters
    assert letter.error_type == "SerdeError"  # JsonSerde's, not orjson's JSONDecodeError
    assert "invalid JSON" in letter.error_message


def test_state_values_read_and_written_through_the_twins_match_the_serde() -> None:
    state = PartitionState(JSON)
    state.begin_record()
    for i, value in enumerate(VALUES):
        state[f"k{i}"] = value
        assert dict(state.encoded_items())[f"k{i}"] == JSON.serialize(value)
        assert state.get(f"k{i}") == value
