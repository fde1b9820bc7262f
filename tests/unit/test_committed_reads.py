"""Committed reads (issue 34): PartitionState.committed_get / committed_range see the state as of the last committed
transaction, never a change of an open or aborted one, from another thread while the poll loop writes; and the
query handler (pipeline/core/queries.py) over the driver's tasks."""

from __future__ import annotations

import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from pipeline.app import App, Table
from pipeline.cli import main
from pipeline.core.queries import Queries, RowsRead, StandbyReads, murmur2
from pipeline.examples.running_totals import app as running_totals
from pipeline.examples.windowed_totals import app as windowed_totals
from pipeline.kafka.liveness import Beat, Peers
from pipeline.metrics import HealthServer, Metrics
from pipeline.query_client import query
from pipeline.settings import ConfigError, Settings
from pipeline.sinks.kafka.commit import abort_transaction
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint
from pipeline.state.restore_setup import StandbyCopy
from pipeline.state.tables import TableStore
from pipeline.testing.driver import AppDriver
from tests.harness import Harness
from tests.unit.test_several_inputs import TRADES, limits


def committed(data: dict[str, int]) -> PartitionState:
    state = PartitionState()
    state.begin_record()
    for key, value in data.items():
        state[key] = value
    state.commit()
    return state


# -- the store -------------------------------------------------------------------------------------------------------
def test_an_open_transaction_is_not_seen_a_commit_is() -> None:
    state = committed({"a": 1, "b": 2})
    state.begin_record()
    state["a"] = 10
    del state["b"]
    state["c"] = 3
    assert [state.committed_get(k) for k in "abc"] == [b"1", b"2", None]
    assert state.committed_range("", 10) == [("a", b"1"), ("b", b"2")]
    state.commit()
    assert [state.committed_get(k) for k in "abc"] == [b"10", None, b"3"]
    assert state.committed_range("", 10) == [("a", b"10"), ("c", b"3")]


def test_after_an_abort_and_a_failed_record_the_committed_value_is_seen() -> None:
    state = committed({"a": 1})
    state.begin_record()
    state["a"] = 2
    state["n"] = 5
    state.undo_transaction()
    assert (state.committed_get("a"), state.committed_get("n")) == (b"1", None)
    state.begin_record()
    state["a"] = 3
    state.undo_record()
    assert state.committed_get("a") == b"1"
    assert state.committed_range("", 10) == [("a", b"1")]


def test_a_range_is_bounded_ordered_and_by_prefix() -> None:
    state = committed({f"acct-{i}@{w}": i for i in range(3) for w in (20, 10)} | {"other": 0})
    assert state.committed_range("acct-1@", 10) == [("acct-1@10", b"1"), ("acct-1@20", b"1")]
    assert [k for k, _ in state.committed_range("acct-", 3)] == ["acct-0@10", "acct-0@20", "acct-1@10"]


class Interleaved(dict[str, Any]):
    """A dict of the state whose n-th get() (counted from arm()) first runs what the poll loop does at that moment:
    the reader's reads, interleaved with the writer's steps exactly where a thread switch could put them."""

    def arm(self, steps: dict[int, Callable[[], None]]) -> None:
        self.steps, self.calls = steps, 0

    def get(self, key: str, default: Any = None) -> Any:
        steps = getattr(self, "steps", {})
        self.calls = getattr(self, "calls", 0) + 1
        if (step := steps.pop(self.calls, None)) is not None:
            self.steps = {}  # the writer's own reads do not count
            step()
            self.steps = steps
        return super().get(key, default)


def interleaved(data: dict[str, int]) -> tuple[PartitionState, Interleaved, Interleaved]:
    state = committed(data)
    state._data = values = Interleaved(state._data)
    state._before_txn = undo = Interleaved(state._before_txn)
    return state, values, undo


def write(state: PartitionState, key: str, value: int) -> Callable[[], None]:
    def step() -> None:
        state.begin_record()
        state[key] = value

    return step


def test_a_key_written_between_the_reads_is_read_from_the_undo_log() -> None:
    state, values, _ = interleaved({"a": 1})
    values.arm({1: write(state, "a", 2)})  # after the undo log said untouched, before the data is read
    assert state.committed_get("a") == b"1"
    state.undo_transaction()
    values.arm({1: write(state, "a", 3)})
    assert state.committed_range("", 10) == [("a", b"1")]


@pytest.mark.parametrize("undo", ["transaction", "record"])
def test_a_write_undone_between_the_reads_is_not_seen(undo: str) -> None:
    """Written after the undo log was read, undone after the data was read: the data's value was never committed."""
    state, values, log = interleaved({"a": 1})
    values.arm({1: write(state, "a", 2)})
    log.arm({2: state.undo_transaction if undo == "transaction" else state.undo_record})
    assert state.committed_get("a") == b"1"


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Threads switch every microsecond: the races between the reads and the writes actually happen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_a_reader_thread_never_sees_an_uncommitted_or_aborted_value(fine_switching: None) -> None:
    """The poll loop's part: each transaction writes generation n into every key, record by record (some records
    fail and are undone), and commits or aborts (every third). A committed state has one generation in all keys;
    an aborted one wrote -1. The reader must see one committed generation in every range, never -1, never one going
    back."""
    keys = [f"k{i}" for i in range(8)]
    state = committed(dict.fromkeys(keys, 0))
    stop = threading.Event()
    seen: list[str] = []

    def write() -> None:
        for n in range(1, 3_000):
            aborting = n % 3 == 0
            for i, key in enumerate(keys):
                state.begin_record()
                state[key] = -1 if aborting else n
                if i % 3 == 1:
                    del state[key]
                    state[key] = -1 if aborting else n
                if (n + i) % 5 == 0:  # a failing record: undone, then done again
                    state.undo_record()
                    state.begin_record()
                    state[key] = -1 if aborting else n
            state.undo_transaction() if aborting else state.commit()
        stop.set()

    def read() -> None:
        last = 0
        while not stop.is_set():
            values = {int(v) for _, v in state.committed_range("k", 100)}
            one = state.committed_get("k5")
            if len(values) != 1 or -1 in values or one is None or int(one) < last or min(values) < last:
                seen.append(f"range {sorted(values)}, k5 {one!r}, after {last}")
                return
            last = int(one)

    reader = threading.Thread(target=read)
    reader.start()
    write()
    reader.join()
    assert not seen, seen


# -- the query handler over the driver --------------------------------------------------------------------------------
def queries_of(driver: AppDriver, **settings: object) -> Queries:
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32", **settings)
    return Queries(driver.app, s, driver.tasks, lambda: driver.partitions)


def answer(queries: Queries, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    reply = queries.handle(path, headers or {})
    assert reply is not None
    return reply.status, orjson.loads(reply.body) if reply.body else {}


def test_a_query_during_an_open_transaction_and_after_its_abort_sees_the_committed_value() -> None:
    driver = AppDriver(running_totals, partitions=2, auto_commit=False)
    queries = queries_of(driver)
    driver.send("acct-1", {"id": 1, "amount": 5})
    driver.commit()
    p = driver._partition(None, b"acct-1")
    status, body = answer(queries, "/state/acct-1")
    assert (status, body["partition"], body["offset"], body["value"]) == (200, p, 1, [1, 5])
    driver.send("acct-1", {"id": 2, "amount": 7})  # open: not committed
    assert driver.tasks[p].state["acct-1"] == [2, 12]
    assert answer(queries, "/state/acct-1")[1]["value"] == [1, 5]
    abort_transaction(driver.tasks[p].txn)
    assert answer(queries, "/state/acct-1")[1]["value"] == [1, 5]
    driver.commit()  # the aborted record again, committed this time
    status, body = answer(queries, "/state/acct-1")
    assert (body["offset"], body["value"]) == (2, [2, 12])
    assert answer(queries, "/state/acct-9")[0] == 404


def test_range_min_offset_and_refusals() -> None:
    driver = AppDriver(running_totals, partitions=1)
    queries = queries_of(driver, query_wait_ms=50)
    for i in range(3):
        driver.send(f"acct-{i}", {"id": i, "amount": i})
    status, body = answer(queries, "/state?prefix=acct-&limit=2&partition=0")
    assert (status, [e["key"] for e in body["entries"]], body["offset"]) == (200, ["acct-0", "acct-1"], 3)
    assert answer(queries, "/state/acct-1?min_offset=2")[0] == 200
    status, body = answer(queries, "/state/acct-1?min_offset=3")
    assert status == 503 and "commit past input offset 3" in str(body["error"])
    assert answer(queries, "/state?prefix=x&limit=0")[0] == 400
    assert answer(queries, "/state/__eos.stream_time")[0] == 400
    assert queries.handle("/metrics", {}) is None


def test_a_partition_not_owned_redirects_to_its_owner_or_answers_503() -> None:
    driver = AppDriver(running_totals, partitions=2)
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32")
    tasks = {0: driver.tasks[0]}
    owners = {1: "peer:8080"}
    queries = Queries(driver.app, s, tasks, lambda: 2, owners.get, address="me:8080")
    reply = queries.handle("/state/k?partition=1", {})
    assert reply is not None and (reply.status, reply.headers["Location"]) == (
        307,
        "http://peer:8080/state/k?partition=1",
    )
    owners.clear()
    status, body = answer(queries, "/state/k?partition=1")
    assert status == 503 and "not owned here" in str(body["error"])


def test_the_token_is_required_over_http_and_never_echoed() -> None:
    driver = AppDriver(running_totals, partitions=1)
    queries = queries_of(driver, query_token="s3cret-token")
    driver.send("acct-1", {"id": 1, "amount": 5})
    server = HealthServer(Metrics(), lambda: True, 0, "127.0.0.1", routes=queries.route).start()
    url = f"http://127.0.0.1:{server.port}/state/acct-1"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 401 and b"s3cret" not in refused.value.read()
        request = urllib.request.Request(url, headers={"Authorization": "Bearer s3cret-token"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert orjson.loads(reply.read())["value"] == [1, 5]
    finally:
        server.stop()
    assert "s3cret" not in repr(queries.settings) and queries.settings.redacted()["query_token"] == "***"


@pytest.mark.parametrize(
    ("key", "expected"),  # the Java client's test vectors (org.apache.kafka.common.utils.UtilsTest)
    [(b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536), (b"abc", 479470107)],
)
def test_murmur2_is_kafkas(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected & 0xFFFFFFFF


# -- the client and `pipeline query` --------------------------------------------------------------------------------
def test_the_client_and_the_command_follow_the_redirect_to_the_owner(capsys: pytest.CaptureFixture[str]) -> None:
    driver = AppDriver(running_totals, partitions=2)
    driver.send("acct-1", {"id": 1, "amount": 5})
    p = driver._partition(None, b"acct-1")
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32")
    directory: dict[int, str] = {}
    servers = []
    for owned in (1 - p, p):  # the first one asked does not own the key's partition
        queries = Queries(driver.app, s, {owned: driver.tasks[owned]}, lambda: 2, directory.get)
        servers.append(HealthServer(Metrics(), lambda: True, 0, "127.0.0.1", routes=queries.route).start())
        directory[owned] = f"127.0.0.1:{servers[-1].port}"
    first = f"http://{directory[1 - p]}"
    try:
        answer = query(first, "acct-1")
        assert (answer.value, answer.partition, answer.offset) == ([1, 5], p, 1)
        assert answer.hops == [first, f"http://{directory[p]}"]
        assert main(["query", "pipeline.examples.running_totals:app", "acct-1", "--url", first]) == 0
        assert orjson.loads(capsys.readouterr().out)["value"] == [1, 5]
        assert main(["query", "pipeline.examples.running_totals:app", "acct-9", "--url", first]) == 1
        assert query(first, None, prefix="acct-", partition_key="acct-1").body["entries"] == [
            {"key": "acct-1", "value": [1, 5]}
        ]
    finally:
        for server in servers:
            server.stop()


def test_a_partition_being_restored_answers_503_with_retry_after() -> None:
    harness = Harness()
    task = harness.new_task(0)
    task.start(5, restore=True)  # RESTORING until its state is complete
    s = Settings.load(env={}, metrics_port=1, query_enabled=True)
    queries = Queries(running_totals, s, {0: task}, lambda: 1)
    reply = queries.handle("/state/acct", {})
    assert reply is not None and (reply.status, reply.headers["Retry-After"]) == (503, "1")
    assert b"being restored" in reply.body
    task.restored(PartitionState())  # complete (empty): answers, at the committed offset
    assert answer(queries, "/state/acct") == (
        404,
        {"key": "acct", "partition": 0, "topic": "in", "offset": 5, "found": False, "value": None},
    )


def test_the_directory_names_the_freshest_owner_heard_within_the_bound() -> None:
    peers = Peers("me", bound_s=1.0)
    peers.heard(Beat("a", "m-a", query_address="a:1", partitions=(0, 1)), now=10.0)
    peers.heard(Beat("b", "m-b", query_address="b:1", partitions=(1,)), now=10.5)
    peers.heard(Beat("c", "m-c", query_address="c:1", partitions=(2,), stopping=True), now=10.5)
    assert [peers.owner(p, now=10.9) for p in (0, 1, 2)] == ["a:1", "b:1", None]  # b took 1 over; c stopped
    assert peers.owner(0, now=11.2) is None  # a not heard for longer than the bound
    assert Beat.decode(Beat("d", partitions=(3, 4), query_address="d:1").encode()) == Beat(
        "d", partitions=(3, 4), query_address="d:1"
    )


def test_a_co_partitioned_tables_query_sees_its_committed_value() -> None:
    store = TableStore(Table("t"))
    store.apply(b"a", b"1")
    store.commit()
    store.apply(b"a", b"2")
    store.apply(b"b", b"3")
    assert (store.committed_get(b"a"), store.committed_get(b"b")) == (b"1", None)
    store.undo_transaction()
    assert store.committed_get(b"a") == b"1"
    store.apply(b"a", None)
    store.commit()
    assert store.committed_get(b"a") is None

    driver = AppDriver(limits, partitions=1, auto_commit=False)
    queries = queries_of(driver)
    driver.update_table("limits", "a", 10, timestamp_ms=1)
    driver.send("a", {"qty": 1}, topic=TRADES, timestamp_ms=2)
    driver.commit()
    status, body = answer(queries, "/tables/limits/a")
    assert (status, body["value"], body["partition"]) == (200, 10, 0)
    driver.update_table("limits", "a", 20, timestamp_ms=3)
    driver.send("a", {"qty": 1}, topic=TRADES, timestamp_ms=4)  # open: the table's 20 is not committed
    table = driver.tasks[0].tables[limits.table_specs["limits"].topic]  # type: ignore[attr-defined]
    assert table.data[b"a"] == b"20"
    assert answer(queries, "/tables/limits/a")[1]["value"] == 10
    assert answer(queries, "/tables/nope/a")[0] == 400


def test_a_windowed_apps_windows_are_a_range_without_the_timers() -> None:
    driver = AppDriver(windowed_totals, partitions=1)
    queries = queries_of(driver)
    for i, ts in enumerate((1_000, 2_000, 11_000)):
        driver.send("account-1", {"id": i, "amount": 5}, timestamp_ms=ts)
    driver.send("account-2", {"id": 9, "amount": 1}, timestamp_ms=11_500)
    status, body = answer(queries, "/state?prefix=account-1@&key=account-1")
    assert (status, body["entries"]) == (
        200,
        [{"key": "account-1@0", "value": [2, 10]}, {"key": "account-1@10000", "value": [1, 5]}],
    )
    everything = answer(queries, "/state?prefix=&limit=2&partition=0")[1]["entries"]
    assert [e["key"] for e in everything] == ["account-1@0", "account-1@10000"]  # the timers' entries are not shown
    assert answer(queries, "/state?prefix=__eos.&partition=0")[0] == 400


def test_a_key_past_its_wall_clock_ttl_reads_as_absent_before_its_expiry_fires() -> None:
    def remember(state: Any, record: Any) -> list[Any]:
        state[record.key] = record.value
        return []

    expiring = App(
        "ttl", "ttl-in", "ttl-out", remember, state_ttl_ms=1_000, state_ttl_clock="wall", on_timer=lambda s, t: []
    )
    driver = AppDriver(expiring, partitions=1)
    queries = queries_of(driver)
    driver.send("a", 1)
    driver.send("b", 2)
    assert [e["key"] for e in answer(queries, "/state?prefix=&partition=0")[1]["entries"]] == ["a", "b"]
    driver.now_ms = 5_000  # past the deadline; the expiry has not run (no loop turn)
    assert "a" in driver.tasks[0].state._data
    assert answer(queries, "/state/a")[0] == 404
    assert answer(queries, "/state?prefix=&partition=0")[1]["entries"] == []


def test_the_endpoint_binds_where_configured() -> None:
    assert Settings.load(env={"PIPELINE_METRICS_HOST": "127.0.0.1"}).metrics_host == "127.0.0.1"
    assert Settings.load(env={}).metrics_host == "0.0.0.0"
    with pytest.raises(ConfigError, match="QUERY_ENABLED needs METRICS_PORT"):
        Settings.load(env={"PIPELINE_QUERY_ENABLED": "true"})
    with pytest.raises(ConfigError, match="QUERY_PARTITIONER"):
        Settings.load(env={"PIPELINE_QUERY_PARTITIONER": "random"})


# -- ?allow_standby=1 ------------------------------------------------------------------------------------------------
def standby_setup(owner_offset: int | None) -> tuple[Queries, StandbyCopy, int]:
    """A process that owns nothing and keeps a warm copy of acct-1's partition, applied up to input offset 1 (the
    owner's state after its first record, borrowed from the driver), the owner elsewhere at `owner_offset`."""
    driver = AppDriver(running_totals, partitions=2)
    driver.send("acct-1", {"id": 1, "amount": 5})
    p = driver._partition(None, b"acct-1")
    copy = StandbyCopy(p, driver.tasks[p].state, 7, None, Checkpoint("in", p, 1))
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32", query_wait_ms=2000)
    reads = StandbyReads({p: copy}, lambda q: owner_offset if q == p else None, "in")
    return Queries(driver.app, s, {}, lambda: 2, {p: "owner:1"}.get, address="me:1", standbys=reads), copy, p


def test_a_standby_answers_only_when_allowed_and_says_how_far_behind_it_is() -> None:
    queries, copy, p = standby_setup(owner_offset=3)
    reply = queries.handle("/state/acct-1", {})
    assert reply is not None and (reply.status, reply.headers["Location"]) == (307, "http://owner:1/state/acct-1")
    status, body = answer(queries, "/state/acct-1?allow_standby=1")
    assert status == 200 and body == {
        "key": "acct-1",
        "partition": p,
        "topic": "in",
        "offset": 1,
        "found": True,
        "value": [1, 5],
        "standby": True,
        "changelog_offset": 7,
        "owner_offset": 3,
        "behind": 2,
    }
    status, body = answer(queries, f"/state?prefix=acct-&partition={p}&allow_standby=1")
    assert (status, body["entries"], body["standby"], body["behind"]) == (
        200,
        [{"key": "acct-1", "value": [1, 5]}],
        True,
        2,
    )
    copy_of_0 = StandbyReads({0: copy}, lambda q: None, "in")
    tables = Queries(limits, queries.settings, {}, lambda: 1, {0: "owner:1"}.get, standbys=copy_of_0)
    reply = tables.handle("/tables/limits/a?allow_standby=1&partition=0", {})  # a copy holds no table: redirected
    assert reply is not None and reply.status == 307
    unknown, _, _ = standby_setup(owner_offset=None)
    assert answer(unknown, "/state/acct-1?allow_standby=1")[1]["behind"] is None  # the owner's beats not heard


def test_a_standby_waits_for_min_offset_as_an_owner_does() -> None:
    queries, copy, p = standby_setup(owner_offset=3)
    status, body = answer(queries, "/state/acct-1?allow_standby=1&min_offset=1&partition=" + str(p))
    assert status == 503 or body["offset"] > 1  # not yet applied past 1: waits, then (nothing moves) 503
    assert status == 503 and "standby copy" in str(body["error"])
    advance = threading.Timer(0.2, lambda: setattr(copy, "last_checkpoint", Checkpoint("in", p, 2)))
    advance.start()
    status, body = answer(queries, "/state/acct-1?allow_standby=1&min_offset=1")
    advance.join()
    assert (status, body["offset"], body["behind"]) == (200, 2, 1)


@pytest.mark.usefixtures("state_store")  # a copy in memory and on disk (tests/unit/conftest.py)
def test_a_standby_copy_of_a_newer_state_version_answers_at_that_version() -> None:
    """A copy holds the changelog's values as they are (tagged with the version that wrote them, older ones not
    migrated): a query reads them at the App's version, as the owner's state gives them."""
    from tests.snapshots.versioned_app import v2
    from tests.unit.conftest import make_state

    app = v2.with_topics("in", "out")
    state = make_state(app.state_serde)
    state.load({"acct-1": b'\xffv2:{"count":2,"sum":9}', "acct-2": b"[1,7]", "__eos.state_version": b"2"})
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32")
    copies = {p: StandbyCopy(p, state, 7, None, Checkpoint("in", p, 1)) for p in (0, 1)}
    queries = Queries(
        app, s, {}, lambda: 2, lambda p: "owner:1", address="me:1", standbys=StandbyReads(copies, lambda p: 3, "in")
    )
    status, body = answer(queries, "/state/acct-1?allow_standby=1&partition=0")
    assert (status, body["value"]) == (200, {"count": 2, "sum": 9})
    status, body = answer(queries, "/state?prefix=acct-&partition=0&allow_standby=1")
    assert (status, body["entries"]) == (
        200,
        [{"key": "acct-1", "value": {"count": 2, "sum": 9}}, {"key": "acct-2", "value": {"count": 1, "sum": 7}}],
    )


def test_the_directory_carries_the_owners_committed_offsets() -> None:
    peers = Peers("me", bound_s=1.0)
    peers.heard(Beat("a", "m-a", query_address="a:1", partitions=(0, 1), offsets=(12, -1)), now=10.0)
    assert [peers.committed(p, now=10.5) for p in (0, 1, 2)] == [12, None, None]
    assert peers.committed(0, now=11.2) is None  # not heard within the bound
    beat = Beat("d", partitions=(3, 4), offsets=(5, 6))
    assert Beat.decode(beat.encode()) == beat


# -- a store of committed rows (the PostgreSQL sink's tables) --------------------------------------------------------
class Rows(RowsRead):
    """p's committed rows as the tables would give them: `data` and `offset` move together (one statement)."""

    def __init__(self, data: dict[str, bytes], offset: list[int]) -> None:
        super().__init__("in")
        self.data, self.offset = data, offset

    def committed_get(self, key: str) -> bytes | None:
        self.committed_offset = self.offset[0]
        return self.data.get(key)

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        self.committed_offset = self.offset[0]
        return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))[:limit]

    def offset_now(self) -> int | None:
        return self.offset[0]


def test_a_partition_not_running_here_is_read_from_the_committed_rows() -> None:
    driver = AppDriver(running_totals, partitions=2)
    driver.send("acct-1", {"id": 1, "amount": 5})
    p = driver._partition(None, b"acct-1")
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32", query_wait_ms=2000)
    offset = [4]
    rows = Rows({"acct-1": b"[4, 40]"}, offset)
    queries = Queries(driver.app, s, {1 - p: driver.tasks[1 - p]}, lambda: 2, rows=lambda q: rows)
    assert answer(queries, "/state/acct-1") == (
        200,
        {"key": "acct-1", "partition": p, "topic": "in", "offset": 4, "found": True, "value": [4, 40]},
    )
    assert answer(queries, f"/state?prefix=acct&partition={p}")[1]["entries"] == [{"key": "acct-1", "value": [4, 40]}]
    advance = threading.Timer(0.2, lambda: offset.__setitem__(0, 6))
    advance.start()
    assert answer(queries, "/state/acct-1?min_offset=5")[1]["offset"] == 6  # waited for the rows to move past 5
    advance.join()
    other = next(f"acct-{i}" for i in range(2, 50) if driver._partition(None, f"acct-{i}".encode()) == 1 - p)
    driver.send(other, {"id": 2, "amount": 7})
    assert answer(queries, f"/state/{other}")[1] == {  # the partition running here: its task's, from memory
        "key": other,
        "partition": 1 - p,
        "topic": "totals-input",
        "offset": 1,
        "found": True,
        "value": [1, 7],
    }
