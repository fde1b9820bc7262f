"""PartitionState: encoded values, per-record and per-transaction undo, changelog changes, restore loading."""

from __future__ import annotations

import random

import orjson
import pytest

from pipeline.serde import JSON
from pipeline.state import PartitionState
from tests.unit.conftest import make_state, on_disk

pytestmark = pytest.mark.usefixtures("state_store")  # every test on both stores (tests/unit/conftest.py)


def enc(value: object) -> bytes:
    return orjson.dumps(value)


def committed_state(data: dict[str, object]) -> PartitionState:
    """A state whose last commit holds `data`."""
    state = make_state()
    state.begin_record()
    for key, value in data.items():
        state[key] = value
    state.commit()
    return state


def changes(state: PartitionState) -> dict[str, object]:
    """changes() decoded: key -> value, or None for a delete."""
    result = {}
    for key, value in state.changes():
        assert key not in result, f"{key} yielded twice"
        result[key] = None if value is None else JSON.deserialize(value)
    return result


# -- encoded storage -------------------------------------------------------------------------------------------------
def test_values_are_stored_encoded_so_mutating_a_returned_object_changes_nothing() -> None:
    state = make_state()
    original = {"items": [1, 2], "n": 1}
    state["k"] = original
    original["items"].append(99)  # the object handed in
    got = state["k"]
    got["items"].append(3)  # the object handed out
    got["n"] = 42
    assert state["k"] == {"items": [1, 2], "n": 1}
    assert state["k"] is not state["k"]
    assert dict(state.encoded_items()) == {"k": enc({"items": [1, 2], "n": 1})}


def test_mapping_view() -> None:
    state = committed_state({"a": 1, "b": [1, 2]})
    assert len(state) == 2
    assert set(state) == {"a", "b"}
    assert "a" in state and "zz" not in state and 1 not in state
    assert state.get("zz", "default") == "default"
    assert state["b"] == [1, 2]
    with pytest.raises(KeyError):
        del state["zz"]


def test_non_str_keys_are_rejected_with_a_clear_error() -> None:
    state = make_state()
    for key in (1, b"bytes", ("t",), None):
        with pytest.raises(TypeError, match="state keys must be str, not"):
            state[key] = 1  # type: ignore[index]
    assert len(state) == 0 and not state.in_transaction


def test_none_values_are_rejected_with_a_clear_error() -> None:
    state = committed_state({"k": 1})
    with pytest.raises(ValueError, match=r"None cannot be stored.*del state\[key\]"):
        state["k"] = None
    assert state["k"] == 1
    assert changes(state) == {} and not state.in_transaction


def test_a_value_the_serde_cannot_encode_changes_nothing() -> None:
    state = committed_state({"k": 1})
    with pytest.raises(TypeError):
        state["k"] = object()
    assert state["k"] == 1 and changes(state) == {}


# -- undo_record -----------------------------------------------------------------------------------------------------
def test_undo_record_restores_set_overwrite_and_delete() -> None:
    state = committed_state({"overwritten": 1, "deleted": 2, "untouched": 3})
    state.begin_record()
    state["new"] = 10
    state["overwritten"] = 11
    del state["deleted"]
    state.undo_record()
    assert dict(state) == {"overwritten": 1, "deleted": 2, "untouched": 3}
    assert changes(state) == {}
    assert not state.in_transaction


def test_undo_record_restores_a_key_set_then_deleted_and_a_key_deleted_then_set() -> None:
    state = committed_state({"existing": 1})
    state.begin_record()
    state["fresh"] = 1
    del state["fresh"]
    del state["existing"]
    state["existing"] = 5
    state["existing"] = 6
    state.undo_record()
    assert dict(state) == {"existing": 1}
    assert changes(state) == {}


def test_undo_record_keeps_earlier_changes_of_the_transaction() -> None:
    state = committed_state({"a": 1, "b": 2, "c": 3})
    # record 1 (succeeds): touches a and b
    state.begin_record()
    state["a"] = 100
    del state["b"]
    state["x"] = "created"
    # record 2 (fails): touches keys already touched in this transaction and keys first touched here
    state.begin_record()
    state["a"] = 200  # touched earlier: goes back to record 1's value, not to the commit's
    state["b"] = 201  # deleted earlier: is deleted again
    del state["x"]  # created earlier: comes back
    state["c"] = 300  # first touched here: back to the commit's value
    state["y"] = 301  # first touched here, absent at commit: gone again
    state.undo_record()
    assert dict(state) == {"a": 100, "c": 3, "x": "created"}
    assert changes(state) == {"a": 100, "b": None, "x": "created"}
    # the keys first touched by the failed record are no longer part of the transaction: aborting it later
    # must still restore everything record 1 did
    state.undo_transaction()
    assert dict(state) == {"a": 1, "b": 2, "c": 3}


def test_undo_record_then_a_later_record_touches_the_same_keys() -> None:
    state = committed_state({"c": 3})
    state.begin_record()
    state["c"] = 30
    state.undo_record()
    state.begin_record()
    state["c"] = 31
    assert changes(state) == {"c": 31}
    state.undo_transaction()
    assert dict(state) == {"c": 3}


def test_undo_record_of_the_only_record_leaves_no_transaction() -> None:
    state = committed_state({})
    state.begin_record()
    state["k"] = 1
    assert state.in_transaction
    state.undo_record()
    assert not state.in_transaction and dict(state) == {}


# -- undo_transaction, commit ------------------------------------------------------------------------------------------
def test_undo_transaction_returns_to_the_last_commit() -> None:
    state = committed_state({"a": 1, "b": 2})
    for i in range(3):
        state.begin_record()
        state["a"] = i
        state[f"new{i}"] = i
    del state["b"]
    state.undo_transaction()
    assert dict(state) == {"a": 1, "b": 2}
    assert changes(state) == {} and not state.in_transaction
    # and the state keeps working transactionally afterwards
    state.begin_record()
    state["a"] = 7
    assert changes(state) == {"a": 7}


def test_commit_clears_the_undo_logs() -> None:
    state = committed_state({"a": 1})
    state.begin_record()
    state["a"] = 2
    state["b"] = 3
    state.commit()
    assert not state.in_transaction and changes(state) == {}
    state.undo_transaction()  # nothing open: nothing to undo
    assert dict(state) == {"a": 2, "b": 3}
    state.begin_record()
    state["a"] = 4
    state.undo_record()  # only the record after the commit is undone
    assert dict(state) == {"a": 2, "b": 3}


# -- changes -------------------------------------------------------------------------------------------------------
def test_changes_yields_upserts_and_deletes() -> None:
    state = committed_state({"updated": 1, "deleted": 2, "same": 3})
    state.begin_record()
    state["updated"] = 10
    del state["deleted"]
    state["created"] = {"x": 1}
    assert changes(state) == {"updated": 10, "deleted": None, "created": {"x": 1}}
    assert dict(state.changes())["updated"] == enc(10)  # already encoded, ready for the changelog


def test_changes_skips_a_key_created_and_deleted_in_the_same_transaction() -> None:
    state = committed_state({"a": 1})
    state.begin_record()
    state["temp"] = 1
    state.begin_record()
    del state["temp"]
    assert changes(state) == {}  # no tombstone for a key the changelog never saw


def test_changes_yields_a_key_deleted_and_re_set_to_a_new_value() -> None:
    state = committed_state({"a": 1})
    state.begin_record()
    del state["a"]
    state.begin_record()
    state["a"] = 2
    assert changes(state) == {"a": 2}


def test_changes_yields_the_last_value_of_a_key_set_many_times() -> None:
    state = committed_state({})
    for i in range(5):
        state.begin_record()
        state["k"] = i
    assert changes(state) == {"k": 4}


def test_changes_skips_a_key_set_back_to_its_committed_value() -> None:
    state = committed_state({"a": 1, "b": [1, 2]})
    state.begin_record()
    state["a"] = 2
    state.begin_record()
    state["a"] = 1
    state["b"] = [1, 2]  # the same value, re-encoded
    assert changes(state) == {}


# -- load ------------------------------------------------------------------------------------------------------------
def test_load_applies_entries_in_order_and_none_deletes() -> None:
    state = make_state()
    state.load([("a", enc(1)), ("b", enc(2)), ("a", enc(3)), ("b", None), ("c", enc(4)), ("gone", None)])
    assert dict(state) == {"a": 3, "c": 4}
    assert not state.in_transaction and changes(state) == {}
    state.load([("c", None), ("b", enc(5))])
    assert dict(state) == {"a": 3, "b": 5}
    assert dict(state.encoded_items()) == {"a": enc(3), "b": enc(5)}


def test_a_dict_loaded_into_an_empty_state_is_taken_over_not_copied() -> None:
    # A restore's snapshot: one dict of every key; a copy would double the table at the restore's peak.
    if on_disk():
        pytest.skip("the memory store's own saving: a disk store writes the entries to RocksDB")
    snapshot = {"a": enc(1), "b": enc(2), "gone": None}
    state = make_state()
    state.load(snapshot)
    assert dict(state) == {"a": 1, "b": 2}
    assert state._data is snapshot
    batch = {"b": None, "c": enc(3)}
    state.load(batch)  # a state with entries: the batch is applied, not taken
    assert dict(state) == {"a": 1, "c": 3} and batch == {"b": None, "c": enc(3)}


# -- randomized model test ---------------------------------------------------------------------------------------------
KEYS = [f"k{i}" for i in range(8)]


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_match_a_dict_model(seed: int) -> None:
    rng = random.Random(seed)
    state = make_state()
    committed: dict[str, object] = {}  # the model at the last commit
    current: dict[str, object] = {}  # the model now
    for _txn in range(60):
        for _record in range(rng.randint(0, 6)):
            before_record = dict(current)
            state.begin_record()
            for _op in range(rng.randint(0, 5)):
                key = rng.choice(KEYS)
                if key in current and rng.random() < 0.35:
                    del state[key]
                    del current[key]
                else:
                    value = rng.choice([rng.randint(0, 3), [rng.randint(0, 3)], {"v": rng.randint(0, 3)}])
                    state[key] = value
                    current[key] = value
            if rng.random() < 0.3:  # the record fails
                state.undo_record()
                current = before_record
            assert dict(state) == current
        # changes() describes exactly how to get from the last commit to now
        diff = changes(state)
        replayed = dict(committed)
        for key, value in diff.items():
            if value is None:
                assert key in committed, f"tombstone for {key}, which the last commit did not hold"
                del replayed[key]
            else:
                replayed[key] = value
        assert replayed == current
        differing = {k for k in committed.keys() | current.keys() if committed.get(k) != current.get(k)}
        assert differing <= diff.keys()
        if rng.random() < 0.3:  # the transaction aborts
            state.undo_transaction()
            current = dict(committed)
        else:
            state.commit()
            committed = dict(current)
        assert dict(state) == current
        assert changes(state) == {} and not state.in_transaction
