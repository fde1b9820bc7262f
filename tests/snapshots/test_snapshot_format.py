"""The chunk codec and the manifest: round trips, and every kind of damage is detected."""

from __future__ import annotations

import random

import pytest

from pipeline.state.snapshot_format import (
    HEADER,
    CorruptChunk,
    Manifest,
    decode_chunk,
    encode_chunk,
    manifest_checksum,
    peek_chunk,
    snapshot_id,
    split_chunks,
)

SID = snapshot_id("app", 0, None, 0, 100)


def random_entries(n: int, seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    alphabet = "abcxyzé日\U0001f600_-"
    return {
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) + str(i): rng.randbytes(rng.randint(0, 50))
        for i in range(n)
    }


def test_chunks_round_trip_any_keys_and_values_including_empty_ones():
    entries = random_entries(5_000)
    entries[""] = b""
    decoded: dict[str, bytes] = {}
    chunks = list(split_chunks(sorted(entries.items()), chunk_bytes=4_096))
    assert len(chunks) > 10
    for index, (keys, values) in enumerate(chunks):
        payload, crc = encode_chunk(SID, index, keys, values)
        assert len(payload) <= 4_096 + HEADER.size + 200  # one entry may overshoot, never a whole chunk
        assert peek_chunk(payload) == (SID, index)
        sid, got_index, got_keys, got_values, got_crc = decode_chunk(payload)
        assert (sid, got_index, got_crc) == (SID, index, crc)
        decoded.update(zip(got_keys, got_values, strict=True))
    assert decoded == entries


@pytest.mark.parametrize("nul_in", ["nothing", "a key", "a value", "both"])
def test_both_layouts_round_trip(nul_in):
    keys = ["a", "", "c\x00d" if nul_in in ("a key", "both") else "cd", "é"]
    values = [b"1", b"", b"x\x00y" if nul_in in ("a value", "both") else b"xy", b"\xff"]
    payload, crc = encode_chunk(SID, 0, keys, values)
    assert payload[5] == {"nothing": 3, "a key": 2, "a value": 1, "both": 0}[nul_in]  # the layout flags
    assert decode_chunk(payload) == (SID, 0, keys, values, crc)
    assert decode_chunk(encode_chunk(SID, 1, [], [])[0])[2:4] == ([], [])


def test_an_oversized_entry_gets_a_chunk_of_its_own():
    chunks = list(split_chunks([("a", b"1"), ("big", b"x" * 10_000), ("b", b"2")], chunk_bytes=1_000))
    assert [keys for keys, _ in chunks] == [["a"], ["big"], ["b"]]


@pytest.mark.parametrize("damage", ["flip-body", "flip-header-count", "truncate", "not-a-chunk"])
def test_damaged_chunks_are_detected(damage):
    payload, _ = encode_chunk(SID, 3, ["k1", "k2"], [b"v1", b"v2"])
    if damage == "flip-body":
        payload = payload[:-1] + bytes([payload[-1] ^ 1])
    elif damage == "flip-header-count":
        payload = payload[:28] + (3).to_bytes(4, "little") + payload[32:]  # n: 3 entries, not 2
    elif damage == "truncate":
        payload = payload[:-3]
    else:
        payload = b'{"type": "something else"}'
    with pytest.raises(CorruptChunk):
        decode_chunk(payload)


def test_manifest_round_trip_and_garbage():
    m = Manifest(SID, 2, 0, "app-changelog", 100, 42, 3, 10, 999, manifest_checksum([1, 2, 3]), 7, "now", "prev")
    assert Manifest.decode(m.encode()) == m
    for garbage in (b"", b"{", b'{"type": "eos-snapshot-manifest"}', b'{"a": 1}'):
        with pytest.raises(ValueError):
            Manifest.decode(garbage)


def test_snapshot_ids_are_deterministic_in_their_inputs():
    assert snapshot_id("a", 0, "b", 1, 2) == snapshot_id("a", 0, "b", 1, 2)
    assert (
        len(
            {
                snapshot_id("a", 0, "b", 1, 2),
                snapshot_id("a", 1, "b", 1, 2),
                snapshot_id("a", 0, None, 1, 2),
                snapshot_id("a", 0, "b", 1, 3),
                snapshot_id("x", 0, "b", 1, 2),
            }
        )
        == 5
    )
