"""JSON serde and exact numbers: `JsonSerde(decimal=True)` round-trips Decimal digit for digit, through records,
state, the changelog and full snapshot chunks; the plain serde refuses a Decimal instead of turning it into a float."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from pipeline.app import App, Output
from pipeline.serde import JSON, JsonSerde, SerdeError
from pipeline.state import PartitionState
from pipeline.state.snapshot_format import decode_chunk, encode_chunk
from pipeline.testing.driver import AppDriver

EXACT = JsonSerde(decimal=True)
AMOUNTS = [
    Decimal("0.10"),
    Decimal("1.00"),
    Decimal("-0.01"),
    Decimal("12345678901234567890.123456789012345"),  # past a float's 17 significant digits
    Decimal("1E+3"),
    Decimal("2.5E-12"),
    Decimal("0.000"),
]


def same(a: Decimal, b: object) -> bool:
    """Equal, a Decimal, and the same digits and scale: 1.00 is not 1.0."""
    return isinstance(b, Decimal) and a.as_tuple() == b.as_tuple()


@pytest.mark.parametrize("amount", AMOUNTS, ids=str)
def test_a_decimal_round_trips_exactly_with_its_scale(amount: Decimal) -> None:
    encoded = EXACT.serialize({"amount": amount, "n": 3})
    assert encoded is not None
    decoded = EXACT.deserialize(encoded)
    assert same(amount, decoded["amount"]), (amount, encoded, decoded)
    assert decoded["n"] == 3 and type(decoded["n"]) is int
    assert orjson.loads(encoded)["amount"] == float(amount)  # a JSON number on the wire: any JSON reader takes it


def test_a_decimal_is_written_digit_for_digit_never_through_a_float() -> None:
    assert EXACT.serialize([Decimal("0.10"), Decimal("12345678901234567890.12")]) == b"[0.10,12345678901234567890.12]"
    assert EXACT.deserialize(b"0.1") + EXACT.deserialize(b"0.2") == Decimal("0.3")  # 0.30000000000000004 in floats


def test_the_plain_json_serde_refuses_a_decimal_naming_the_option() -> None:
    with pytest.raises(TypeError, match=r"JsonSerde\(decimal=True\)"):
        JSON.serialize({"amount": Decimal("0.10")})
    with pytest.raises(TypeError, match="not JSON serializable: object"):
        EXACT.serialize(object())


@pytest.mark.parametrize("data", [b"NaN", b'{"a": Infinity}', b"-Infinity", b"\xff", b"{", b""])
def test_what_is_not_json_is_a_serde_error_in_decimal_mode_too(data: bytes) -> None:
    with pytest.raises(SerdeError):
        EXACT.deserialize(data)
    with pytest.raises(SerdeError):
        JSON.deserialize(data)


@pytest.mark.parametrize("value", [Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")])
def test_a_decimal_with_no_json_number_is_refused(value: Decimal) -> None:
    with pytest.raises(TypeError, match="no JSON number"):
        EXACT.serialize(value)


def test_state_keeps_decimals_through_the_changelog_and_a_full_snapshot_chunk() -> None:
    state = PartitionState(EXACT)
    for i, amount in enumerate(AMOUNTS):
        state[f"acct-{i}"] = {"balance": amount}
    changelog = dict(state.changes())  # what the transaction writes to the changelog
    keys = sorted(k for k, _ in state.encoded_items())
    chunk, _ = encode_chunk("ab" * 8, 0, keys, [v for _, v in sorted(state.encoded_items())])
    _, _, chunk_keys, chunk_values, _ = decode_chunk(chunk)  # what a restore reads back from a full snapshot
    for entries in (changelog, dict(zip(chunk_keys, chunk_values, strict=True))):
        restored = PartitionState(EXACT)
        restored.load(entries)
        for i, amount in enumerate(AMOUNTS):
            assert same(amount, restored[f"acct-{i}"]["balance"])


def test_a_driver_restore_after_a_crash_keeps_the_exact_balances() -> None:
    def book(state, record):
        state[record.key] = state.get(record.key, Decimal("0.00")) + record.value["amount"]
        return [Output(key=record.key, value={"balance": state[record.key]})]

    app = App(
        name="ledger",
        input_topic="payments",
        output_topic="balances",
        process=book,
        value_serde=EXACT,
        output_value_serde=EXACT,
        state_serde=EXACT,
    )
    driver = AppDriver(app)
    for amount in AMOUNTS:
        driver.send("acct", {"amount": amount})
    driver.crash()
    [out] = driver.send("acct", {"amount": Decimal("0.01")})
    total = sum(AMOUNTS, Decimal("0.00")) + Decimal("0.01")
    assert same(total, out.value["balance"]) and same(total, driver.state()["acct"])
