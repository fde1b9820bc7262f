"""The in-memory state of one input partition, with the bookkeeping that makes it transactional.

Values are kept serialised: `state[k]` decodes a fresh object, `state[k] = v` encodes it. So the user cannot change
state behind the runner's back by mutating an object in place, the changelog gets bytes that are already encoded,
and restore copies bytes without decoding them.

Two undo logs hold the value each touched key had before:
- per record: a failing `process` call is undone without trace (retry and dead letter see the state as it was);
- per transaction: an aborted transaction is undone, and its touched keys are the changes to write to the changelog.

The second one also answers reads from other threads (interactive queries): a key's committed value is its entry in
the transaction's undo log if the transaction touched it, else its value now (`committed_get`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, cast

from pipeline.app import CodeError, State, StateTimers
from pipeline.serde import JSON, Serde, SerdeError, fast_deserialize, fast_serialize


class _Missing(enum.Enum):  # an enum member rather than object(): `is _MISSING` then narrows the type
    MISSING = enum.auto()


class _Untouched(enum.Enum):  # not in the transaction's undo log (committed reads)
    UNTOUCHED = enum.auto()


_MISSING: Final = _Missing.MISSING
_UNTOUCHED: Final = _Untouched.UNTOUCHED


class PartitionState(State):
    # What `process` reads of the App's tables (docs/inputs.md): name -> a read-only mapping. The runner sets them.
    tables: Mapping[str, Mapping[Any, Any]] = MappingProxyType({})

    def __init__(self, serde: Serde = JSON) -> None:
        self._serde = serde
        # The serde's C twins (pipeline/serde.py), per record on the hot path; what they refuse goes to the serde.
        self._loads = fast_deserialize(serde) or serde.deserialize
        self._dumps = fast_serialize(serde) or serde.serialize
        self._data: dict[str, bytes] = {}
        self._before_txn: dict[str, Any] = {}
        self._before_record: dict[str, Any] = {}
        self._first_touched_in_record: list[str] = []
        # Bumped by every commit and undo, never per record: a reader on another thread that saw no change of it
        # read every key within one transaction, where the undo log only grows (committed_get).
        self._boundaries = 0

    @property
    def timers(self) -> StateTimers:
        """An App without timers has none: scheduling one is a mistake that would fail every record."""
        raise CodeError("process", "uses state.timers, but the App has no on_timer", "give the App on_timer=...")

    # -- the mapping the user sees ------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._serde.deserialize(self._data[key])

    def get(self, key: str, default: Any = None) -> Any:
        encoded = self._data.get(key)  # Mapping.get would go through __getitem__ and a KeyError: the hot path
        if encoded is None:
            return default
        try:
            return self._loads(encoded)
        except Exception:
            return self._serde.deserialize(encoded)

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"state keys must be str, not {type(key).__name__}")
        if value is None:
            raise ValueError("None cannot be stored as a state value (it is the tombstone); use `del state[key]`")
        try:
            encoded = self._dumps(value)
        except Exception:
            encoded = self._serde.serialize(value)
        if encoded is None:  # None is the tombstone: storing it would delete the key from the changelog
            raise SerdeError(f"the state serde encoded a {type(value).__name__} as None")
        self._remember(key)
        self._data[key] = encoded

    def __delitem__(self, key: str) -> None:
        if key not in self._data:
            raise KeyError(key)
        self._remember(key)
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    # -- record and transaction boundaries (runner only) ----------------------------------------------------------
    def begin_record(self) -> None:
        self._before_record.clear()
        self._first_touched_in_record.clear()

    def undo_record(self) -> None:
        """Puts back every key the current record touched, as if `process` had never been called."""
        self._boundaries += 1
        self._restore(self._before_record)
        for key in self._first_touched_in_record:
            del self._before_txn[key]
        self.begin_record()

    def changes(self) -> Iterator[tuple[str, bytes | None]]:
        """(key, encoded value or None for a delete) of every key whose value changed in this transaction."""
        for key, before in self._before_txn.items():
            now = self._data.get(key, _MISSING)
            if now is before or now == before:
                continue
            yield key, (None if now is _MISSING else now)

    def commit(self) -> None:
        self._boundaries += 1
        self._before_txn.clear()
        self.begin_record()

    def undo_transaction(self) -> None:
        """Back to the state as of the last committed transaction."""
        self._boundaries += 1
        self._restore(self._before_txn)
        self._before_txn.clear()
        self.begin_record()

    @property
    def in_transaction(self) -> bool:
        return bool(self._before_txn)

    # -- committed reads, from any thread (interactive queries) -------------------------------------------------
    def committed_get(self, key: str) -> bytes | None:
        """The encoded value of `key` as of the last committed transaction (None: absent), safe to call from another
        thread while the poll loop processes. No lock: every write notes the key's value in the undo log before it
        changes the data, so the undo log is read before and after the data; a commit or an undo between the reads
        (`_boundaries` moved) makes the reader read again."""
        while True:
            seen = self._boundaries
            value = self._committed_value(key)
            if self._boundaries == seen:
                return value

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to `limit` (key, encoded value) of the committed keys starting with `prefix`, in key order, all as of
        the same committed transaction, from any thread. A scan of every key (the in-memory store keeps no order)."""
        while True:
            seen = self._boundaries
            # Each update is one C-level copy (atomic under the GIL), the data's first: a committed key that a record
            # deletes after it was copied is in the undo log by the time that is copied (noted before the delete).
            keys: set[str] = set()
            keys.update(self._data)
            keys.update(self._before_txn)
            found: list[tuple[str, bytes]] = []
            for key in sorted(k for k in keys if k.startswith(prefix)):
                value = self._committed_value(key)
                if value is not None:
                    found.append((key, value))
                    if len(found) >= limit:
                        break
            if self._boundaries == seen:
                return found

    def _committed_value(self, key: str) -> bytes | None:
        """Right if no commit or undo ran meanwhile (the callers check). Touched in this transaction: the undo log
        has its committed value. Not touched before the data is read and not after: the data's value is committed."""
        before = self._before_txn.get(key, _UNTOUCHED)
        if before is _UNTOUCHED:
            now = self._data.get(key)
            before = self._before_txn.get(key, _UNTOUCHED)  # touched meanwhile: `now` may be its new value
            if before is _UNTOUCHED:
                return now
        return None if before is _MISSING else cast(bytes, before)

    # -- restore (no undo logs involved) -----------------------------------------------------------------------
    def load(self, entries: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]) -> None:
        """Applies encoded entries in order; None deletes. Used by restore only. A mapping (a snapshot's entries, or
        a changelog batch folded to its last write per key) goes in with one C-level update; a dict given to an empty
        state becomes its data: handed over, not copied, the caller does not use it afterwards."""
        data = self._data
        if isinstance(entries, Mapping):  # one value per key: update all, then take out the deleted ones
            if not data and type(entries) is dict:
                # A restore's first load is the snapshot's whole dict: a copy would hold a second table of every
                # key at once, +30 bytes per key at the peak of a big restore (tools/bench/big_state.py).
                self._data = data = entries
            else:
                data.update(cast(Mapping[str, bytes], entries))  # the None values are taken out just below
            if None in entries.values():
                for key in [key for key, value in entries.items() if value is None]:
                    del data[key]
            return
        for key, value in entries:
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    def encoded_items(self) -> Iterable[tuple[str, bytes]]:
        """The dict's items view, not a copy: the snapshot writer sorts the keys of its mapping rather than a list of
        (key, value) tuples."""
        return self._data.items()

    # -- internals -----------------------------------------------------------------------------------------------
    def _remember(self, key: str) -> None:
        before = self._data.get(key, _MISSING)
        if key not in self._before_record:
            self._before_record[key] = before
        if key not in self._before_txn:
            self._before_txn[key] = before
            self._first_touched_in_record.append(key)

    def _restore(self, before: dict[str, Any]) -> None:
        for key, value in before.items():
            if value is _MISSING:
                self._data.pop(key, None)
            else:
                self._data[key] = value
