"""Interactive queries of committed state (QUERY_ENABLED; issue 34), served on the health endpoint's port.

    GET /state/<key>                         the key's committed value: its partition from the key (QUERY_PARTITIONER)
    GET /state?prefix=..&limit=..&key=..     committed keys starting with prefix, in key order, on one partition: the
                                             partition of `key` (a windowed App's `<account>@<start>` keys live in the
                                             partition of `<account>`), or `partition=` (default: prefix's partition)
    GET /tables/<name>/<key>                 a table's value: a global one's here (every instance holds all of it), a
                                             co-partitioned one's committed value from the key's partition
    ?min_offset=N                            answer once the partition committed past input offset N (waits up to
                                             QUERY_WAIT_MS, else 503 naming what it waited for): read your own writes
    ?allow_standby=1                         (state, not tables) a process that keeps a warm standby copy of the
                                             partition (STANDBY_REPLICAS) answers from it instead of redirecting:
                                             `standby: true`, `offset` the input offset of the last transaction the
                                             copy applied, `owner_offset` the owner's committed one per its heartbeat
                                             and `behind` the difference (null: not known)

Only committed state (docs/guarantees.md: committed-reads): the values come from `PartitionState.committed_get` and
`committed_range`, never a change of an open or aborted transaction, and the answer names the input position it
reflects: `offset`, the partition's committed offset (every input record below it, none from it on). A partition
restoring answers 503 with Retry-After; one owned elsewhere 307 to its owner's address from the directory (the
heartbeats, pipeline/kafka/liveness.py); one nobody is known to own 503. The PostgreSQL sink reads a partition it
does not run from its tables instead (pipeline/sinks/postgres/queries.py). With QUERY_TOKEN set, a request without
`Authorization: Bearer <token>` gets 401. Neither the token nor any value is ever logged.

Settings: QUERY_ENABLED (off by default; needs METRICS_PORT), QUERY_TOKEN (a Secret), QUERY_ADDRESS (host:port at
which the others reach this process; default <hostname>:METRICS_PORT), QUERY_PARTITIONER (how the input's producers
placed keys: murmur2, the Kafka default, or crc32, this project's sample inputs), QUERY_WAIT_MS (the longest
?min_offset= wait, 5000). Redirects need the heartbeats (FAILURE_DETECTION_MS > 0): without them a partition owned
elsewhere answers 503.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote

import orjson

from pipeline.app import App
from pipeline.core.lifecycle import Phase
from pipeline.core.task import Task
from pipeline.settings import Settings
from pipeline.state.restore_setup import AtStateVersion, StandbyCopy
from pipeline.state.tables import TableView
from pipeline.state.timed import RESERVED, TTL_PREFIX, WallTtlState

log = logging.getLogger(__name__)
MAX_LIMIT = 1_000  # keys in one range answer at most
WAIT_STEP_S = 0.002  # how often a ?min_offset= wait looks at the committed offset
RETRY_AFTER_S = 1
# The GIL's switch interval while queries are served. An HTTP thread woken by a request waits for the GIL until the
# poll loop's thread lets go of it, at the latest after this interval: with Python's 5 ms a local read's p99 was 9 ms
# at 1,000 queries/s (BENCHMARKS.md). The poll loop pays a thread switch per query that arrives while it runs.
SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


def serve_promptly() -> None:
    """Called once by a runner that serves queries: the HTTP threads get the GIL within SWITCH_INTERVAL_S."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner, librdkafka's murmur2_random for non-empty keys)."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length - whole
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h = ((h ^ data[whole]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": lambda key, n: (murmur2(key) & 0x7FFFFFFF) % n,  # what producers with default settings do
    "crc32": lambda key, n: zlib.crc32(key) % n,  # what this project's sample inputs do (pipeline/testing/inputs.py)
}


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # digit for digit: a float would not be
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_reply(status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, orjson.dumps(body, default=_json_default) + b"\n", headers or {})


def split_target(target: str) -> tuple[str, dict[str, str]]:
    """A request target's path and its query parameters, decoded (a repeated one: its last value; one without a value
    is left out), as urlsplit and parse_qs would give them: a few string splits cost a third of what those two did,
    per answer (BENCHMARKS.md)."""
    path, _, query = target.partition("#")[0].partition("?")
    params = {}
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if value:
            params[unquote(name.replace("+", " "))] = unquote(value.replace("+", " "))
    return path, params


def error(status: int, message: str, retry_after: bool = False) -> Reply:
    return json_reply(status, {"error": message}, {"Retry-After": str(RETRY_AFTER_S)} if retry_after else None)


def own_address(settings: Settings) -> str:
    """Where other processes reach this one's queries: QUERY_ADDRESS, or <hostname>:METRICS_PORT."""
    return settings.query_address or f"{socket.gethostname()}:{settings.metrics_port}"


def _expired(state: Any, key: str) -> bool:
    """Wall-clock TTL: a key past its committed deadline reads as absent, as in `process`, before the poll loop's
    expiry has deleted it."""
    if not isinstance(state, WallTtlState):
        return False
    deadline = state.committed_get(TTL_PREFIX + key)
    return deadline is not None and int(deadline) <= state.wall_clock()


@dataclass(frozen=True)
class StandbyReads:
    """What `?allow_standby=1` reads: this process's warm copies (Standbys.copies, p -> StandbyCopy: a dict the
    HTTP thread only gets from) and the owners' committed input offsets per the directory's heartbeats."""

    copies: Mapping[int, StandbyCopy]
    owner_committed: Callable[[int], int | None]
    input_topic: str


class StandbyRead:
    """A warm standby copy read as `_read` reads a task. Its changelog position and last checkpoint are taken before
    its state is read: the copy applies committed changelog only, in order, and moves both after the records, so the
    value read reflects at least that input offset."""

    commit_lock = contextlib.nullcontext()  # the copy's writer never opens a transaction: nothing to hold still

    def __init__(self, copy: StandbyCopy, reads: StandbyReads) -> None:
        self.input_topic, self.changelog_offset = reads.input_topic, copy.position
        checkpoint = copy.last_checkpoint
        self.committed_offset = None if checkpoint is None else checkpoint.next_input_offset
        self.owner_offset = reads.owner_committed(copy.partition)
        self.state = copy.state

    def fields(self) -> dict[str, Any]:
        """What a standby's answer adds: that it is one, and how far behind the owner it is, as far as known."""
        behind = None
        if self.owner_offset is not None and self.committed_offset is not None:
            behind = max(0, self.owner_offset - self.committed_offset)  # the owner's beat may be older than the copy
        return {
            "standby": True,
            "changelog_offset": self.changelog_offset,
            "owner_offset": self.owner_offset,
            "behind": behind,
        }


class RowsRead:
    """A partition's committed state read from a store that holds only committed state, each read with the
    committed input offset it reflects, both of one snapshot (the PostgreSQL sink's tables: one statement each,
    pipeline/sinks/postgres/queries.py). `committed_offset`: that of the last read (None: nothing committed yet)."""

    def __init__(self, input_topic: str) -> None:
        self.input_topic = input_topic
        self.committed_offset: int | None = None

    def committed_get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        raise NotImplementedError

    def offset_now(self) -> int | None:
        """The partition's committed input offset now (?min_offset=)."""
        raise NotImplementedError


class Queries:
    """What the HTTP thread asks of one runner. `tasks`: the runner's dict p -> task (read, never changed here: each
    get is atomic); `partitions()`: the input topic's partition count; `owner(p)`: the address of p's owner per the
    directory (None: not known), `tables`: the global tables' views; `address`: this process's own."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        tasks: Mapping[int, Task],
        partitions: Callable[[], int],
        owner: Callable[[int], str | None] = lambda p: None,
        tables: Mapping[str, TableView] | None = None,
        address: str = "",
        standbys: StandbyReads | None = None,
        rows: Callable[[int], RowsRead] | None = None,
    ) -> None:
        self.app, self.settings, self.tasks, self.address, self.standbys = app, settings, tasks, address, standbys
        self._rows = rows  # a partition not served from memory here is read there (the PostgreSQL sink's tables)
        self._partitions, self._owner, self._tables = partitions, owner, tables or {}
        self._token = settings.query_token.encode() if settings.query_token else b""
        self._partitioner = PARTITIONERS[settings.query_partitioner]
        self._key_serde = app.streams[0].key_serde
        self._decode = app.state_serde.deserialize

    # -- the request -----------------------------------------------------------------------------------------------
    def route(self, path: str, headers: Mapping[str, str]) -> tuple[int, bytes, Mapping[str, str]] | None:
        """HealthServer's routes (pipeline/metrics.py)."""
        try:
            reply = self.handle(path, headers)
        except Exception as e:  # the broker not answering the partition count, a bug: one line, no value, no token
            log.warning("query %s failed: %s", split_target(path)[0].split("/")[1], type(e).__name__)
            reply = error(500, f"the query failed ({type(e).__name__}); see the instance's log")
        if reply is None:
            return None
        return reply.status, reply.body, {"Content-Type": reply.content_type, **reply.headers}

    def handle(self, path: str, headers: Mapping[str, str]) -> Reply | None:
        """The answer to a GET of `path` (with its query string); None when the path is not a query's."""
        url_path, params = split_target(path)
        if not (url_path == "/state" or url_path.startswith(("/state/", "/tables/"))):
            return None
        if self._token and not self._authorised(headers.get("authorization", "")):
            return error(401, "a query needs the header Authorization: Bearer <QUERY_TOKEN>")
        try:
            if url_path.startswith("/tables/"):
                name, _, key = url_path[len("/tables/") :].partition("/")
                return self._table(name, unquote(key), params, path)
            if url_path == "/state":
                return self._range(params, path)
            return self._get(unquote(url_path[len("/state/") :]), params, path)
        except (ValueError, TypeError) as e:  # a bad parameter: the message names it, never a value of the state
            return error(400, str(e))

    def _authorised(self, header: str) -> bool:
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    # -- one key, a range ------------------------------------------------------------------------------------------
    def _get(self, key: str, params: Mapping[str, str], path: str) -> Reply:
        if not key or key.startswith(RESERVED):
            raise ValueError(f"a state key, not empty and not starting with {RESERVED!r}")
        p = self.partition_of(key, params)
        task = self._serving(p, params, path)
        if isinstance(task, Reply):
            return task
        offset, encoded = self._read(task, lambda state: state.committed_get(key), key)
        value = None if encoded is None else self._decode(encoded)
        body = {"key": key, "partition": p, "topic": task.input_topic, "offset": offset, "found": encoded is not None}
        extra = task.fields() if isinstance(task, StandbyRead) else {}
        return json_reply(200 if encoded is not None else 404, {**body, "value": value, **extra})

    def _range(self, params: Mapping[str, str], path: str) -> Reply:
        prefix = params.get("prefix", "")
        if prefix.startswith(RESERVED):
            raise ValueError(f"prefix must not start with {RESERVED!r}")
        limit = int(params.get("limit", "100"))
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, not {limit}")
        p = self.partition_of(params.get("key", prefix), params)
        task = self._serving(p, params, path)
        if isinstance(task, Reply):
            return task
        offset, entries = self._read(task, lambda state: self._visible_range(state, prefix, limit), None)
        items = [{"key": k, "value": self._decode(v)} for k, v in entries]
        extra = task.fields() if isinstance(task, StandbyRead) else {}
        return json_reply(200, {"partition": p, "topic": task.input_topic, "offset": offset, "entries": items, **extra})

    @staticmethod
    def _visible_range(state: Any, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        """The range without the reserved keys (timers, TTL deadlines), asked again with a larger limit while they
        took places in it."""
        asked = limit
        while True:
            entries = state.committed_range(prefix, asked)
            visible = [(k, v) for k, v in entries if not k.startswith(RESERVED) and not _expired(state, k)]
            if len(visible) >= limit or len(entries) < asked:
                return visible[:limit]
            asked *= 4

    def partition_of(self, key: str, params: Mapping[str, str], serde: Any = None) -> int:
        """`partition=`, else the partition the input's producers placed `key` in (encoded by its key serde)."""
        count = self._partitions()
        if "partition" in params:
            p = int(params["partition"])
            if not 0 <= p < count:
                raise ValueError(f"partition must be from 0 to {count - 1}, not {p}")
            return p
        try:
            encoded = (serde or self._key_serde).serialize(key)
        except Exception:
            encoded = key.encode()
        return self._partitioner(encoded if isinstance(encoded, bytes) else key.encode(), count)

    # -- who answers -----------------------------------------------------------------------------------------------
    def _serving(
        self, p: int, params: Mapping[str, str], path: str, elsewhere: bool = True
    ) -> Task | StandbyRead | RowsRead | Reply:
        """p's task if this process serves p now, after the ?min_offset= wait; if not, and `elsewhere` (the state,
        not a table): the committed rows (PostgreSQL sink), or with ?allow_standby=1 p's warm copy if this process
        keeps one; else the reply that says why not."""
        task = self.tasks.get(p)
        phase = None if task is None else task.phase
        if elsewhere and self._rows is not None and phase not in (Phase.RUNNING, Phase.REWINDING, Phase.STOPPED):
            return self._rows_serving(p, params)
        if task is None or phase in (Phase.DROPPED, Phase.CLOSED):
            copy = self._copy(p) if elsewhere and params.get("allow_standby") in ("1", "true") else None
            if copy is not None:
                return self._standby_serving(copy, params)
            address = self._owner(p)
            if address and address != self.address:
                return Reply(307, b"", {"Location": f"http://{address}{quote(path, safe='/?&=%:@')}"})
            return error(503, f"partition {p} is not owned here and its owner is not known", retry_after=True)
        if phase in (Phase.NEW, Phase.RESTORING):
            return error(503, f"partition {p} is being restored", retry_after=True)
        if "min_offset" in params:
            wanted = int(params["min_offset"])
            if not self._wait_committed(task, wanted):
                message = (
                    f"waited {self.settings.query_wait_ms} ms for partition {p} to commit past input offset "
                    f"{wanted}; committed up to {task.committed_offset}"
                )
                return error(503, message, retry_after=True)
        return task

    def _wait_committed(self, task: Task, wanted: int) -> bool:
        until = time.monotonic() + self.settings.query_wait_ms / 1000
        while (task.committed_offset or 0) <= wanted:
            if time.monotonic() >= until or task.phase in (Phase.DROPPED, Phase.CLOSED):
                return False
            time.sleep(WAIT_STEP_S)
        return True

    def _copy(self, p: int) -> StandbyCopy | None:
        return None if self.standbys is None else self.standbys.copies.get(p)

    def _standby_serving(self, copy: StandbyCopy, params: Mapping[str, str]) -> StandbyRead | Reply:
        """p's warm copy, once it applied a transaction past ?min_offset= (waited for as an owner's commit)."""
        assert self.standbys is not None  # _copy found the copy there
        read = StandbyRead(copy, self.standbys)
        if "min_offset" not in params:
            return read
        wanted, until = int(params["min_offset"]), time.monotonic() + self.settings.query_wait_ms / 1000
        while (read.committed_offset or 0) <= wanted:
            if time.monotonic() >= until or self._copy(copy.partition) is not copy:
                message = (
                    f"waited {self.settings.query_wait_ms} ms for the standby copy of partition {copy.partition} to "
                    f"apply input offset {wanted}; applied up to {read.committed_offset}"
                )
                return error(503, message, retry_after=True)
            time.sleep(WAIT_STEP_S)
            read = StandbyRead(copy, self.standbys)
        return read

    def _rows_serving(self, p: int, params: Mapping[str, str]) -> RowsRead | Reply:
        """p's committed rows, once they are past ?min_offset= (asked every few ms up to QUERY_WAIT_MS)."""
        assert self._rows is not None
        read = self._rows(p)
        if "min_offset" not in params:
            return read
        wanted, until = int(params["min_offset"]), time.monotonic() + self.settings.query_wait_ms / 1000
        while (now := read.offset_now()) is None or now <= wanted:
            if time.monotonic() >= until:
                message = f"waited {self.settings.query_wait_ms} ms for partition {p} to commit past input offset "
                return error(503, message + f"{wanted}; committed up to {now}", retry_after=True)
            time.sleep(5 * WAIT_STEP_S)  # a database round trip each
        return read

    def _read(
        self, task: Task | StandbyRead | RowsRead, read: Callable[[Any], Any], key: str | None
    ) -> tuple[int | None, Any]:
        """(committed offset, what `read` found in the committed state), both of one commit: Task.commit_lock keeps
        a commit from moving the state and the offset between the two. Rows: the read sets the offset itself."""
        if isinstance(task, RowsRead):
            found = read(task)
            return task.committed_offset, found
        with task.commit_lock:
            state: Any = task.state
            offset = task.committed_offset
            if isinstance(task, StandbyRead) and self.app.state_version > 1:
                state = AtStateVersion(state, self.app)
            found = read(state)
        if key is not None and found is not None and _expired(state, key):
            found = None
        return offset, found

    # -- tables ----------------------------------------------------------------------------------------------------
    def _table(self, name: str, key: str, params: Mapping[str, str], path: str) -> Reply:
        """A global table's value (read here: every instance holds all of it, only moving forward), or a
        co-partitioned table's committed value from the task of the key's partition."""
        view = self._tables.get(name)
        if view is not None:
            value = view.get(key)  # a dict lookup: atomic; read_committed, so committed
            body = {"table": name, "key": key, "found": value is not None, "value": value}
            return json_reply(200 if value is not None else 404, body)
        spec = self.app.table_specs.get(name)
        if spec is None:
            raise ValueError(f"no table {name!r} (this App has {sorted({*self._tables, *self.app.table_specs})})")
        p = self.partition_of(key, params, spec.key_serde)
        task = self._serving(p, params, path, elsewhere=False)  # a copy or the rows hold the state, not the tables
        assert not isinstance(task, (StandbyRead, RowsRead))  # elsewhere=False
        if isinstance(task, Reply):
            return task
        store = getattr(task, "tables", {}).get(spec.topic)  # MultiInputTask's: topic -> TableStore
        encoded_key = spec.key_serde.serialize(key)
        offset, encoded = self._read(
            task, lambda state: None if store is None else store.committed_get(encoded_key), None
        )
        value = None if encoded is None else spec.value_serde.deserialize(encoded)
        body = {"table": name, "key": key, "partition": p, "offset": offset, "found": encoded is not None}
        return json_reply(200 if encoded is not None else 404, {**body, "value": value})
