"""Tables as `process` reads them: `state.tables["name"]`, a read-only mapping key -> latest value.

A table holds the encoded values of a compacted topic by encoded key (a record without a value deletes its key);
reads decode with the table's serdes. Two kinds (docs/inputs.md):
- co-partitioned (`App.tables`): partition p of the table topic, updated by task p in timestamp order with its
  inputs, inside the task's transaction: an abort undoes the updates with the rest (`TableStore`). Its topic is its
  changelog: nothing of it goes to the app's changelog; a restore reads the topic.
- global (`App.global_tables`): every partition, in every instance, updated by the process's own reader
  (pipeline/state/global_tables.py) and never undone: it only moves forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

from pipeline.app import Table
from pipeline.serde import skip_bytes_deserialize, skip_bytes_serialize

_MISSING = object()
_UNTOUCHED = object()


class TableView(Mapping[Any, Any]):
    """Read-only, decoded: what `process` sees of one table."""

    def __init__(self, spec: Table, data: dict[bytes | None, bytes]) -> None:
        self.spec = spec
        self._data = data
        self._encode_key = skip_bytes_serialize(spec.key_serde)
        self._decode_value = skip_bytes_deserialize(spec.value_serde)

    def _key(self, key: Any) -> bytes | None:
        return key if self._encode_key is None else self._encode_key(key)

    def __getitem__(self, key: Any) -> Any:
        encoded = self._data[self._key(key)]
        return encoded if self._decode_value is None else self._decode_value(encoded)

    def get(self, key: Any, default: Any = None) -> Any:
        encoded = self._data.get(self._key(key))
        if encoded is None:
            return default
        return encoded if self._decode_value is None else self._decode_value(encoded)

    def __contains__(self, key: object) -> bool:
        return self._key(key) in self._data

    def __iter__(self) -> Iterator[Any]:
        decode = self.spec.key_serde.deserialize
        return (decode(k) for k in self._data)

    def __len__(self) -> int:
        return len(self._data)


class TableStore:
    """One co-partitioned table's partition: updates undone with an aborted transaction."""

    def __init__(self, spec: Table) -> None:
        self.spec = spec
        self.data: dict[bytes | None, bytes] = {}
        self._before_txn: dict[bytes | None, Any] = {}
        self.view = TableView(spec, self.data)
        self._boundaries = 0  # commits and undos: a committed read that saw one between its looks reads again

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the table topic: the key's new value, or a delete (a tombstone)."""
        if key not in self._before_txn:
            self._before_txn[key] = self.data.get(key, _MISSING)
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value

    def load(self, key: bytes | None, value: bytes | None) -> None:
        """A record read by a restore: no undo."""
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value

    def commit(self) -> None:
        self._boundaries += 1
        self._before_txn.clear()

    def undo_transaction(self) -> None:
        self._boundaries += 1
        for key, before in self._before_txn.items():
            if before is _MISSING:
                self.data.pop(key, None)
            else:
                self.data[key] = before
        self._before_txn.clear()

    def __len__(self) -> int:
        return len(self.data)

    def committed_get(self, key: bytes | None) -> bytes | None:
        """The key's encoded value as of the last commit, from another thread (interactive queries): as
        PartitionState.committed_get, an update notes the key's value before it changes the data."""
        while True:
            seen = self._boundaries
            before = self._before_txn.get(key, _UNTOUCHED)
            if before is _UNTOUCHED:
                now = self.data.get(key)
                before = self._before_txn.get(key, _UNTOUCHED)
                if before is _UNTOUCHED:
                    before = now
            if self._boundaries == seen:
                return None if before is _MISSING else cast(bytes | None, before)
