"""Interactive queries under faults (issue 34), real processes on the real broker: while three instances of
running_totals are SIGKILLed and restarted, a querier asks random instances for whole partitions (ranges) and single
keys. Every answer names the partition's committed offset it reflects; after the run, the checker's committed outputs
are replayed to that offset and must give exactly the answered state: never a value of an open or aborted
transaction, never one of a position the answer does not claim."""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.core.provenance import decode_source
from pipeline.query_client import QueryError, query
from pipeline.testing import inputs
from pipeline.testing.harness import committed_offsets
from tests.faults.conftest import PARTITIONS, assert_exactly_once
from tests.support import eventually

ACCOUNTS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Querier:
    """Asks until stopped; keeps every answer (partition, offset, state found) and what went wrong."""

    addresses: list[str]
    answers: list[tuple[int, int, dict[str, Any], bool]] = field(default_factory=list)  # ..., whole partition
    redirected: int = 0
    refused: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        rng = random.Random(3)
        while not self.stop.is_set():
            url, p = f"http://{rng.choice(self.addresses)}", rng.randrange(PARTITIONS)
            whole = rng.random() < 0.5
            try:
                if whole:
                    answer = query(url, None, prefix="account-", limit=1000, partition=p, timeout_s=0.5)
                    state = {e["key"]: e["value"] for e in answer.body["entries"]}
                else:
                    key = f"account-{rng.choice(self._keys_of(p))}"
                    answer = query(url, key, partition=p, timeout_s=0.5)
                    state = {key: answer.value}  # None: absent at that offset
            except QueryError as e:  # a killed instance (status 0), a restore, a rebalance: asked again
                self.refused[e.status] += 1
                time.sleep(0.01)
                continue
            self.redirected += len(answer.hops) > 1
            self.answers.append((p, answer.offset or 0, state, whole))

    @staticmethod
    def _keys_of(p: int) -> list[int]:
        return [k for k in range(ACCOUNTS) if inputs.account_partition(f"account-{k}".encode(), PARTITIONS) == p]


def replayed(final_outputs: list[Any]) -> dict[int, list[tuple[int, str, list[int]]]]:
    """partition -> (input offset, account, [count, sum] after it), in offset order: the committed outputs."""
    by_partition: dict[int, list[tuple[int, str, list[int]]]] = defaultdict(list)
    for record in final_outputs:
        source = decode_source(record.headers)
        assert source is not None
        value = orjson.loads(record.value)
        by_partition[source[0]].append((source[1], record.key.decode(), [value["count"], value["sum"]]))
    for outputs in by_partition.values():
        outputs.sort()
    return by_partition


def state_at(outputs: list[tuple[int, str, list[int]]], offset: int) -> dict[str, list[int]]:
    """The partition's state once every input record below `offset` is processed, per the committed outputs."""
    state: dict[str, list[int]] = {}
    for source_offset, account, value in outputs:
        if source_offset >= offset:
            break
        state[account] = value
    return state


def test_queries_under_sigkills_show_only_committed_state_at_the_offset_they_name(fault_run):
    ports = [free_port() for _ in range(3)]
    addresses = [f"127.0.0.1:{port}" for port in ports]
    run = fault_run(
        query_enabled="true",
        query_partitioner="crc32",  # how pipeline.testing.inputs places the records
        failure_detection_ms="1000",  # the heartbeats carry the directory: redirects
        commit_interval_ms="200",
        test_abort_every="4",  # aborted transactions to look through
    )
    records = list(inputs.running_totals_records(24_000, partitions=PARTITIONS, accounts=ACCOUNTS, seed=11))
    run.feed(records, seconds=20)
    run.start(0)
    assert run.fleet is not None
    by_port = {port: run.fleet.start(1, **_env(port))[0] for port in ports}
    querier = Querier(addresses)
    asking = threading.Thread(target=querier.run, daemon=True)
    asking.start()
    eventually(lambda: len(querier.answers) >= 10, timeout_s=90, interval_s=0.2)  # up and answering: then the kills
    rng = random.Random(5)
    for _ in range(3):
        time.sleep(rng.uniform(2.5, 4.0))
        port = rng.choice([port for port, instance in by_port.items() if instance.alive])
        by_port[port].kill()
        time.sleep(0.5)
        by_port[port] = run.fleet.start(1, **_env(port))[0]  # the same address, a new process
    outcome = run.finish()
    querier.stop.set()
    asking.join(10)
    assert_exactly_once(outcome)
    assert outcome.verdict is not None
    answered = [a for a in querier.answers if a[1] > 0]
    assert len(answered) >= 50, f"{len(querier.answers)} answers, refused {dict(querier.refused)}"
    assert querier.redirected > 0, "no answer came through a redirect to the owner"
    print(f"{len(answered)} answers, {querier.redirected} through a redirect, refused {dict(querier.refused)}")
    outputs = replayed(outcome.verdict.final_outputs)
    wrong = []
    for p, offset, found, whole in answered:
        expected = state_at(outputs[p], offset)
        if (whole and found != expected) or any(expected.get(key) != value for key, value in found.items()):
            wrong.append(
                (
                    p,
                    offset,
                    {
                        k: (found.get(k), expected.get(k))
                        for k in {*found, *expected}
                        if found.get(k) != expected.get(k)
                    },
                )
            )
    assert not wrong, f"{len(wrong)} of {len(answered)} answers not the committed state at their offset: {wrong[:3]}"


def _env(port: int) -> dict[str, str]:
    return {"PIPELINE_METRICS_PORT": str(port), "PIPELINE_QUERY_ADDRESS": f"127.0.0.1:{port}"}


def test_a_partition_being_restored_answers_503_then_its_state(fault_run):
    """One instance builds ~60 k keys; a second one joins and restores the partitions the rebalance gives it, while
    it is asked every few ms: it answers 503 with Retry-After while restoring, then the committed state."""
    first, second = free_port(), free_port()
    run = fault_run(query_enabled="true", query_partitioner="crc32", restore_step_ms="20")
    records = list(inputs.running_totals_records(100_000, partitions=PARTITIONS, accounts=100_000, seed=12))
    run.feed(records, seconds=4)
    run.start(0)
    assert run.fleet is not None
    run.fleet.start(1, **_env(first))
    eventually(lambda: _answers(first, "account-1") == 200 and _caught_up(run), timeout_s=120, interval_s=0.5)
    run.fleet.start(1, **_env(second))
    restoring: set[int] = set()  # the partitions seen answering 503 "being restored"
    answered_after: set[int] = set()  # ... and then 200
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not answered_after:
        for p in range(PARTITIONS):
            status, body, retry_after = _ask(second, p)
            if status == 503 and "being restored" in body:
                assert retry_after == "1", body
                restoring.add(p)
            elif status == 200 and p in restoring:
                answered_after.add(p)
        time.sleep(0.005)
    assert restoring, f"no 503 while restoring seen\n{run.fleet.logs()}"
    assert answered_after, f"p{sorted(restoring)} restoring, never answered after\n{run.fleet.logs()}"
    assert_exactly_once(run.finish())


def _ask(port: int, p: int) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", f"/state?prefix=account-1&limit=5&partition={p}")
        response = connection.getresponse()
        return response.status, response.read().decode(), response.getheader("Retry-After") or ""
    except (OSError, http.client.HTTPException):
        return 0, "", ""
    finally:
        connection.close()


def _answers(port: int, key: str) -> int:
    return _ask(port, inputs.account_partition(key.encode(), PARTITIONS))[0]


def _caught_up(run) -> bool:
    ends = committed_offsets(run.bootstrap, run.app_id, run.input_topic, list(range(PARTITIONS)), 10)
    return sum(ends.values()) >= 100_000


def test_a_standby_answers_when_asked_and_says_how_far_behind_it_is(fault_run):
    """Two instances with STANDBY_REPLICAS=1: each keeps a warm copy of the other's partitions. Asked for a key it
    does not own, an instance redirects to the owner; with ?allow_standby=1 it answers from its copy, says so, and
    names the input offset the copy applied (at least) and the owner's committed one. Each such value must be one
    the key had, per the checker's replay of the committed outputs, at that offset or later: a copy reads committed
    changelog only, never an open or aborted transaction's."""
    ports = [free_port(), free_port()]
    run = fault_run(
        query_enabled="true",
        query_partitioner="crc32",
        failure_detection_ms="1000",  # the heartbeats: the directory, the owners' committed offsets
        standby_replicas="1",
        commit_interval_ms="200",
        test_abort_every="4",
    )
    records = list(inputs.running_totals_records(20_000, partitions=PARTITIONS, accounts=ACCOUNTS, seed=13))
    run.feed(records, seconds=16)
    run.start(0)
    assert run.fleet is not None
    instances = [run.fleet.start(1, **_env(port))[0] for port in ports]
    eventually(lambda: all("standby copy warm" in i.log_path.read_text() for i in instances), 90, 0.2)
    standby: list[tuple[int, int, str, Any]] = []  # partition, offset, key, value
    behind_known = redirected = max_behind = 0
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        for port in ports:
            for p in range(PARTITIONS):
                key = f"account-{Querier._keys_of(p)[0]}"
                plain, _, _ = _ask_path(port, f"/state/{key}?partition={p}")
                status, body, _ = _ask_path(port, f"/state/{key}?partition={p}&allow_standby=1")
                if status != 200 or not body.get("standby"):
                    continue
                assert plain == 307, f"a non-owner answered {plain} without allow_standby"
                redirected += 1
                standby.append((p, body["offset"] or 0, key, body["value"]))
                behind_known += body["behind"] is not None
                max_behind = max(max_behind, body["behind"] or 0)
        time.sleep(0.05)
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert len(standby) >= 20 and redirected, f"{len(standby)} standby answers\n{run.fleet.logs()}"
    assert behind_known, "no standby answer knew the owner's committed offset"
    print(f"{len(standby)} standby answers, {behind_known} knowing how far behind, max behind {max_behind}")
    assert outcome.verdict is not None
    outputs = replayed(outcome.verdict.final_outputs)
    wrong = []
    for p, offset, key, value in standby:
        later = [v for source_offset, account, v in outputs[p] if account == key and source_offset >= offset]
        if value not in [state_at(outputs[p], offset).get(key), *later]:
            wrong.append((p, offset, key, value))
    assert not wrong, (
        f"{len(wrong)} of {len(standby)} standby answers never committed at or after their offset: {wrong}"
    )


def _ask_path(port: int, path: str) -> tuple[int, dict[str, Any], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        raw = response.read()
        return response.status, orjson.loads(raw) if raw else {}, response.getheader("Location") or ""
    except (OSError, http.client.HTTPException):
        return 0, {}, ""
    finally:
        connection.close()


def test_under_workers_each_worker_answers_on_its_own_port_and_the_directory_names_it(fault_run):
    """`pipeline run --workers 2` with QUERY_ENABLED: worker k answers the partitions it owns on METRICS_PORT + 1 + k
    and its heartbeats carry that address; a query asked at the supervisor's port goes to worker 0, then to the
    owner. Every partition is answered, by both workers between them, with the committed state at the offset named."""
    port = next(p for p in iter(free_port, 0) if all(_free(p + k) for k in (1, 2)))
    run = fault_run(
        query_enabled="true", query_partitioner="crc32", failure_detection_ms="1000", commit_interval_ms="200"
    )
    records = list(inputs.running_totals_records(6_000, partitions=PARTITIONS, accounts=ACCOUNTS, seed=12))
    run.feed(records, seconds=10)
    fleet = run.start(0)
    fleet.run_args = ("--workers", "2")
    fleet.start(1, **_env(port))
    workers = {f"http://127.0.0.1:{port + 1 + k}" for k in (0, 1)}

    def every_partition_by_both() -> list[tuple[int, Any]] | None:
        try:
            asked = [(p, query(f"http://127.0.0.1:{port}", None, prefix="account-", partition=p)) for p in range(3)]
        except QueryError:
            return None  # starting, restoring, a rebalance
        return asked if {answer.hops[-1] for _, answer in asked} == workers else None

    answers = eventually(every_partition_by_both, timeout_s=90, interval_s=0.5)
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert outcome.verdict is not None
    outputs = replayed(outcome.verdict.final_outputs)
    for p, answer in answers:
        assert answer.hops[1] == f"http://127.0.0.1:{port + 1}"  # the supervisor's redirect: worker 0
        state = {e["key"]: e["value"] for e in answer.body["entries"]}
        assert state == state_at(outputs[p], answer.offset or 0), p


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
