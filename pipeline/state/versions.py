"""State schema versions: an App declares `state_version` (default 1) and `migrate(version, value) -> value`, which
turns a value written at an older version into the App's current shape (one call, whatever the distance).

Where the version is kept
    each value   written by code at version v > 1 carries it in front, b"\\xffv<v>:" + the serde's bytes, in the
                 changelog and in snapshot chunks alike: the compaction job's last-write-wins fold never decodes
                 values, so each entry keeps the version it was written with. Version 1 (and everything written
                 before versions existed) has no prefix: 0xFF starts no UTF-8 text, so JSON values are never
                 mistaken for tagged ones.
    the state    the reserved entry `__eos.state_version` = the newest version that wrote to it (only above 1).

In memory a state holds the serde's bytes of the current version: the prefix is added where entries leave
(`changes()` for the changelog, `encoded_items()` for a snapshot) and taken off where they come in, at restore,
when older values are migrated. So reading and writing the state costs nothing more. Migrated values are not
written back until the key is written again: every restore migrates them again, the same way.

State newer than the code (a rollback after a newer version ran) refuses to start: StateVersionError.

The disk store (STATE_STORE=disk, pipeline/state/disk_store.py) keeps values as the changelog does, tagged, and
migrates on every read from the disk instead of at the restore: a restart on the same disk never rewrites every key.
"""

from __future__ import annotations

from pipeline.app import Migrate
from pipeline.serde import Serde

VERSION_KEY = "__eos.state_version"
TAG = b"\xffv"


class StateVersionError(RuntimeError):
    """p's state was written by a newer state version than this code knows: it refuses to start."""


def tag(version: int, value: bytes) -> bytes:
    return b"\xffv%d:%s" % (version, value) if version > 1 else value


def untag(value: bytes) -> tuple[int, bytes]:
    """(the version a stored value was written at, the serde's bytes)."""
    if value[:2] != TAG:
        return 1, value
    version, _, payload = value[2:].partition(b":")
    return int(version), payload


def stored_version(data: dict[str, bytes]) -> int:
    raw = data.get(VERSION_KEY)
    return 1 if raw is None else int(raw)


def refuse_newer(data: dict[str, bytes], current: int, where: str) -> None:
    """StateVersionError if the state says a newer version wrote to it."""
    newest = stored_version(data)
    if newest > current:
        raise StateVersionError(
            f"{where}: the state was written by state version {newest}, this code is at version {current}. "
            f"Deploy code at version {newest} or newer (with a migrate for the older versions); a rollback cannot "
            "read state a newer version wrote."
        )


def current_value(stored: bytes, current: int, serde: Serde, migrate: Migrate | None, key: str) -> bytes:
    """A stored (possibly tagged) value as the serde's bytes at the current version, migrated if older."""
    version, payload = untag(stored)
    if version == current:
        return payload
    if version > current:
        raise StateVersionError(f"state key {key!r} was written at state version {version}, this code is at {current}")
    if migrate is None:
        raise StateVersionError(
            f"state key {key!r} was written at state version {version}; the App is at {current} but has no migrate"
        )
    value = migrate(version, serde.deserialize(payload))
    if value is None:
        raise StateVersionError(
            f"migrate({version}, value of state key {key!r}) returned None: return the value as state version "
            f"{current} reads it (a state value cannot be None)"
        )
    migrated = serde.serialize(value)
    if migrated is None:  # None is the tombstone: a state holds no None value
        raise StateVersionError(f"state key {key!r}: migrate({version}, value) gave a value the serde encodes as None")
    return migrated
