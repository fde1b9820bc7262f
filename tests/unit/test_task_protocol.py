"""A KafkaTask and the runner's transaction protocol (pipeline/sinks/kafka/commit.py: commit_transaction,
abort_transaction, close_task): call order and error handling, against the fake producer and consumer of tests/fakes.py
that record every call.

The fakes test the protocol (what is called, in which order, and what happens on each kind of error), not Kafka:
the tests against a real broker live in tests/integration and tests/faults.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

import pipeline.sinks.kafka.task as task_module
from pipeline.app import App, Output
from pipeline.core.lifecycle import Phase
from pipeline.core.processing import PoisonRecordStop
from pipeline.core.provenance import SOURCE_HEADER, encode_source
from pipeline.settings import Settings
from pipeline.sinks.kafka import takeover
from pipeline.sinks.kafka.commit import abort_and_rewind
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import PartitionDropped, Transaction, TransactionAborted, transactional_id
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from tests.fakes import (
    ABORTABLE,
    FENCED,
    GROUP_METADATA,
    RETRIABLE,
    FakeProducer,
    kafka_exception,
    kafka_message,
)
from tests.harness import APP_ID, CHANGELOG, DLQ, INPUT, OUTPUT, Harness, P, msg, poison


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records the task's back-off sleeps instead of sleeping."""
    recorded: list[float] = []
    fake_time = types.SimpleNamespace(monotonic=task_module.time.monotonic, sleep=recorded.append)
    monkeypatch.setattr(task_module, "time", fake_time)
    return recorded


def decoded(value: bytes) -> Any:
    return orjson.loads(value)


# -- fence, start, process ----------------------------------------------------------------------------------------
def test_fence_calls_init_transactions_on_the_partitions_transactional_id() -> None:
    h = Harness()
    task = h.new_task()
    assert h.producers[0].transactional_id == transactional_id(APP_ID, INPUT, P) == f"{APP_ID}.{INPUT}.{P}"
    assert h.calls.names() == []  # nothing happens before fence()
    task.txn.fence()
    assert h.calls.names() == ["init_transactions"]


def test_at_least_once_has_no_transactional_id_and_does_not_fence() -> None:
    h = Harness(processing_guarantee="at_least_once")
    task = h.new_task()
    task.txn.fence()
    assert h.producers[0].transactional_id is None
    assert h.calls.names() == []


def test_start_sets_the_position_and_a_stateful_app_restores_first() -> None:
    h = Harness()
    task = h.new_task()
    task.start(42)
    assert (task.committed_offset, task.next_offset, task.phase) == (42, 42, Phase.RESTORING)


def test_process_begins_a_transaction_lazily_and_tags_outputs_with_their_source() -> None:
    h = Harness()
    task = h.task(committed=5)
    task.process([])
    assert h.calls.names() == []  # no record, no transaction
    task.process([msg(5, amount=10), msg(6, amount=5)])
    task.process([msg(7, amount=1)])
    assert h.calls.names() == ["begin_transaction", "produce", "produce", "produce"]  # one transaction for all
    outputs = h.calls.produced(OUTPUT)
    assert [o["headers"] for o in outputs] == [[(SOURCE_HEADER, encode_source(P, o))] for o in (5, 6, 7)]
    assert [o["key"] for o in outputs] == [b"acct"] * 3
    assert [decoded(o["value"]) for o in outputs] == [
        {"id": "id-5", "count": 1, "sum": 10},
        {"id": "id-6", "count": 2, "sum": 15},
        {"id": "id-7", "count": 3, "sum": 16},
    ]
    assert task.next_offset == 8 and task.committed_offset == 5
    assert h.metric("pipeline_records_in_total", partition=str(P)) == 3
    assert h.metric("pipeline_records_out_total", partition=str(P)) == 3


def test_outputs_with_their_own_topic_partition_and_headers_keep_them_plus_the_source() -> None:
    def process(state, record) -> Iterable[Output]:
        return [Output(value=1, key="k", topic="side", partition=4, headers=(("h", b"v"),)), Output(value=2)]

    h = Harness(app=App("side", INPUT, OUTPUT, process, stateful=False))
    task = h.task(committed=0)
    task.process([msg(0)])
    side, main = h.calls.produced()
    assert (side["topic"], side["partition"], side["headers"]) == ("side", 4, [("h", b"v"), (SOURCE_HEADER, b"2:0")])
    assert (main["topic"], main["partition"], main["key"]) == (OUTPUT, -1, None)  # -1: the producer's partitioner


def test_records_below_the_position_are_skipped() -> None:
    h = Harness()
    task = h.task(committed=5)
    task.process([msg(3), msg(4), msg(5), msg(4)])
    assert [o["headers"][-1] for o in h.calls.produced(OUTPUT)] == [(SOURCE_HEADER, encode_source(P, 5))]
    assert task.next_offset == 6
    assert dict(task.state) == {"acct": [1, 1]}


def test_process_stops_at_once_when_the_task_is_not_running() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.phase = Phase.REWINDING
    task.process([msg(0)])
    assert h.calls.names() == [] and task.next_offset == 0


# -- commit ---------------------------------------------------------------------------------------------------------
def test_commit_writes_changelog_then_checkpoint_then_offsets_then_commits() -> None:
    h = Harness()
    task = h.task(committed=5)
    task.process([msg(5, account="a"), msg(6, account="b", amount=3), msg(7, account="a", amount=2)])
    h.calls.clear()
    h.commit(task)
    assert h.calls.names() == [
        *("produce", "produce", "produce", "send_offsets_to_transaction"),
        *("flush", "commit_transaction"),  # every message acknowledged, then the commit
    ]
    changelog = h.calls.produced(CHANGELOG)
    assert all(c["partition"] == P for c in changelog)  # p's changes go to changelog partition p
    *entries, checkpoint = changelog
    assert {c["key"]: decoded(c["value"]) for c in entries} == {b"a": [2, 3], b"b": [1, 3]}
    assert checkpoint["key"] == CHECKPOINT_KEY and checkpoint["headers"] == [CHECKPOINT_HEADER]
    assert Checkpoint.decode(checkpoint["value"]) == Checkpoint(INPUT, P, 8)
    [(offsets, group, _timeout)] = [a for name, a, _ in h.calls if name == "send_offsets_to_transaction"]
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets] == [(INPUT, P, 8)]  # last offset + 1
    assert group is GROUP_METADATA
    assert task.committed_offset == 8 and not task.state.in_transaction
    assert h.metric("pipeline_transactions_total", partition=str(P), outcome="committed") == 1


def test_commit_without_an_open_transaction_does_nothing() -> None:
    h = Harness()
    task = h.task(committed=0)
    h.commit(task)
    task.process([msg(0)])
    h.commit(task)
    h.calls.clear()
    h.commit(task)
    assert h.calls.names() == []


def test_the_next_transaction_begins_after_a_commit_and_writes_only_its_own_changes() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0, account="a"), msg(1, account="b")])
    h.commit(task)
    h.calls.clear()
    task.process([msg(2, account="b")])
    h.commit(task)
    assert h.calls.names()[0] == "begin_transaction"
    assert [c["key"] for c in h.calls.produced(CHANGELOG)] == [b"b", CHECKPOINT_KEY]


def test_commit_due_on_interval_or_record_count() -> None:
    h = Harness(commit_interval_ms=1_000, commit_max_records=3)
    task = h.task(committed=0)
    assert not task.commit_due(1e12)  # nothing open
    task.process([msg(0)])
    started = task._batch_started
    assert not task.commit_due(started + 0.5)
    assert task.commit_due(started + 1.0)
    task.process([msg(1), msg(2)])
    assert task.commit_due(started)


def test_at_least_once_commit_flushes_then_commits_offsets_on_the_consumer() -> None:
    h = Harness(processing_guarantee="at_least_once")
    task = h.task(committed=0)
    task.process([msg(0), msg(1)])
    h.calls.clear()
    h.commit(task)
    assert h.calls.names() == ["produce", "produce", "flush", "consumer.commit"]
    assert h.calls[-1][1] == ([(INPUT, P, 2)],)


# -- renew-after-abort (docs/guarantees.md) ----------------------------------------------------------------------------
def commit_failed(h: Harness, method: str, error: dict, raises: type[Exception]) -> KafkaTask:
    """A task that processed offset 0 and whose commit then failed in `method` with `error`, raising `raises`."""
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail(method, kafka_exception(**error))
    with pytest.raises(raises, match=method):
        h.commit(task)
    return task


def test_after_an_abort_the_next_transaction_runs_on_a_new_producer_initialised_under_the_same_name() -> None:
    """Without KIP-890 in librdkafka, a request of the aborted transaction still in flight could land in the next
    one (same epoch): p2 committed at 6646 with a changelog that ended at 6499 (a CI fault run)."""
    h = Harness()
    task = commit_failed(h, "send_offsets_to_transaction", ABORTABLE, TransactionAborted)
    old = h.producers[0]
    abort_and_rewind(task)
    assert len(h.producers) == 2
    new = h.producers[1]
    assert new.transactional_id == old.transactional_id and new is task.producer and new is task.txn.producer
    names = h.calls.names()
    assert names.index("abort_transaction") < names.index("init_transactions") < names.index("seek")
    produced_before = len(old.records)
    task.process([msg(0)])
    h.commit(task)
    assert len(old.records) == produced_before and new.records  # nothing more goes through the old one
    assert task.committed_offset == 1


def test_a_renewal_that_cannot_initialise_drops_the_partition() -> None:
    h = Harness()
    task = commit_failed(h, "send_offsets_to_transaction", ABORTABLE, TransactionAborted)
    failing = FakeProducer(h.calls, "p")
    failing.fail("init_transactions", kafka_exception(**FENCED))
    task.txn._renew_with = lambda: failing  # type: ignore[assignment,return-value]
    with pytest.raises(PartitionDropped, match="init_transactions after an abort"):
        abort_and_rewind(task)
    assert task.txn.broken


# -- errors in commit (docs/guarantees.md: unknown-commit-retried) -----------------------------------------------------
@pytest.mark.parametrize("method", ["commit_transaction", "send_offsets_to_transaction"])
def test_a_retriable_error_is_retried_and_not_aborted(method: str) -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail(method, kafka_exception(**RETRIABLE), kafka_exception(**RETRIABLE))
    h.commit(task)
    assert h.calls.count(method) == 3
    assert h.calls.count("abort_transaction") == 0
    assert h.calls.names()[-1] == "commit_transaction"
    assert task.committed_offset == 1 and not task.state.in_transaction


def test_a_commit_outcome_that_stays_unknown_drops_the_partition(sleeps: list[float]) -> None:
    h = Harness(transaction_timeout_ms=1_000)
    task = h.task(committed=0)
    task.process([msg(0)])
    clock = iter(range(0, 10_000, 1))
    task_module.time.monotonic = lambda: float(next(clock)) / 4  # type: ignore[attr-defined]
    h.producers[0].fail("commit_transaction", *[kafka_exception(**RETRIABLE) for _ in range(100)])
    with pytest.raises(PartitionDropped, match="commit_transaction"):
        h.commit(task)
    assert 2 <= h.calls.count("commit_transaction") < 100
    assert h.calls.count("abort_transaction") == 0
    assert task.committed_offset == 0


@pytest.mark.parametrize("method", ["commit_transaction", "send_offsets_to_transaction"])
def test_txn_requires_abort_aborts_then_rewinds_state_and_position(method: str) -> None:
    h = Harness()
    task = h.task(committed=3)
    task.process([msg(3, account="a", amount=10)])
    h.commit(task)  # the last commit: a = [1, 10], position 4
    task.process([msg(4, account="a", amount=5), msg(5, account="b", amount=7)])
    assert dict(task.state) == {"a": [2, 15], "b": [1, 7]}
    h.producers[0].fail(method, kafka_exception(**ABORTABLE))
    h.calls.clear()
    with pytest.raises(TransactionAborted, match=method):
        h.commit(task)
    assert "commit_transaction" not in h.calls.names()[h.calls.names().index(method) + 1 :]
    assert task.committed_offset == 4
    abort_and_rewind(task)
    assert h.calls.names()[-3:] == ["abort_transaction", "init_transactions", "seek"]  # renew-after-abort
    assert h.calls[-1][1] == (INPUT, P, 4)  # the committed offset, never the fetched position
    assert dict(task.state) == {"a": [1, 10]}
    assert not task.state.in_transaction
    assert task.next_offset == 4 and task.phase is Phase.RUNNING
    assert h.metric("pipeline_transactions_total", partition=str(P), outcome="aborted") == 1
    # the records come again and go into a new transaction
    h.calls.clear()
    task.process([msg(4, account="a", amount=5)])
    h.commit(task)
    assert h.calls.names()[0] == "begin_transaction"
    assert dict(task.state) == {"a": [2, 15]} and task.committed_offset == 5


def test_rewind_without_a_committed_offset_seeks_to_the_beginning() -> None:
    h = Harness()
    task = h.task(committed=None)
    task.process([msg(0)])
    abort_and_rewind(task)
    assert h.calls[-1] == ("seek", (INPUT, P, OFFSET_BEGINNING), {})
    assert dict(task.state) == {} and task.next_offset is None


def test_a_seek_that_fails_leaves_the_task_rewinding_until_it_succeeds() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    seek = h.consumer.seek

    def failing_seek(tp: Any) -> None:
        raise kafka_exception(KafkaError._STATE)

    h.consumer.seek = failing_seek  # type: ignore[method-assign]
    abort_and_rewind(task)
    assert task.phase is Phase.REWINDING
    h.calls.clear()
    task.process([msg(1)])  # fetched before the seek took effect: ignored
    assert h.calls.count("begin_transaction") == 0
    h.consumer.seek = seek  # type: ignore[method-assign]
    assert task.try_seek_back(h.consumer)
    assert task.phase is Phase.RUNNING and task.next_offset == 0


def test_an_injected_abort_from_the_test_hook_raises_transaction_aborted() -> None:
    h = Harness(abort_hook=lambda n: n == 2)
    task = h.task(committed=0)
    task.process([msg(0)])
    h.commit(task)
    task.process([msg(1)])
    with pytest.raises(TransactionAborted, match="injected"):
        h.commit(task)
    assert h.calls.count("commit_transaction") == 1


@pytest.mark.parametrize(
    "error",
    [
        dict(code=KafkaError._FENCED, fatal=True),
        dict(code=KafkaError.PRODUCER_FENCED),
        dict(code=KafkaError.INVALID_PRODUCER_EPOCH, retriable=True, txn_requires_abort=True),
        dict(code=KafkaError._TIMED_OUT, fatal=True, retriable=True),
        dict(code=KafkaError._STATE),  # neither retriable nor abortable: the outcome is unknown
    ],
    ids=["_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH-flagged", "fatal", "unknown"],
)
def test_a_fenced_or_fatal_commit_drops_the_partition_without_abort_or_further_commit(error: dict) -> None:
    h = Harness()
    task = commit_failed(h, "commit_transaction", error, PartitionDropped)
    assert h.calls.count("commit_transaction") == 1
    assert task.committed_offset == 0
    task.drop("fenced")  # what the runner does with PartitionDropped
    h.close(task, commit=True)
    assert h.calls.count("commit_transaction") == 1
    assert h.calls.count("abort_transaction") == 0
    assert task.phase is Phase.CLOSED


def test_an_abort_that_fails_fenced_drops_the_partition() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail("abort_transaction", kafka_exception(**FENCED))
    with pytest.raises(PartitionDropped, match="abort_transaction"):
        abort_and_rewind(task)


# -- poison records (docs/guarantees.md: no-silent-skip) ---------------------------------------------------------------
def dlq_headers(row: dict) -> dict[str, bytes]:
    return {k: v for k, v in row["headers"] if k.startswith("eos.dlq.")}


def test_a_poison_record_is_retried_with_backoff_then_dead_lettered_in_the_same_transaction(
    sleeps: list[float],
) -> None:
    h = Harness(processing_max_attempts=3, processing_backoff_ms=1)
    task = h.task(committed=10)
    task.process([msg(10, amount=4), poison(11), msg(12, amount=6)])
    assert sleeps == [0.001, 0.002]  # exponential back-off between the attempts
    assert h.metric("pipeline_processing_errors_total", partition=str(P)) == 3
    assert h.metric("pipeline_dead_letters_total") == 1
    assert h.calls.count("begin_transaction") == 1  # the dead letter is inside the open transaction
    assert [r["topic"] for r in h.calls.produced()] == [OUTPUT, DLQ, OUTPUT]
    [letter] = h.calls.produced(DLQ)
    assert (letter["key"], letter["value"], letter["partition"]) == (b"acct", b"{not json", P)
    headers = dlq_headers(letter)
    assert headers["eos.dlq.topic"] == INPUT.encode()
    assert headers["eos.dlq.partition"] == str(P).encode()
    assert headers["eos.dlq.offset"] == b"11"
    assert headers["eos.dlq.error.type"] == b"SerdeError"
    assert headers["eos.dlq.attempts"] == b"3"
    assert b"invalid JSON" in headers["eos.dlq.error.message"]
    assert dict(task.state) == {"acct": [2, 10]}  # the poison record changed nothing
    assert task.next_offset == 13
    h.calls.clear()
    h.commit(task)
    [(offsets, _, _)] = [a for name, a, _ in h.calls if name == "send_offsets_to_transaction"]
    assert offsets[0].offset == 13  # committed past the poison record, together with its dead letter


def test_each_attempt_sees_the_state_as_it_was_and_a_late_success_is_not_dead_lettered(sleeps: list[float]) -> None:
    attempts = []

    def flaky(state, record) -> Iterable[Output]:
        state["n"] = state.get("n", 0) + 1
        attempts.append(state["n"])
        if len(attempts) < 3:
            raise RuntimeError("flaky")
        return [Output(value=state["n"])]

    h = Harness(app=App("flaky", INPUT, OUTPUT, flaky), processing_max_attempts=3)
    task = h.task(committed=0)
    task.process([msg(0)])
    assert attempts == [1, 1, 1]
    assert dict(task.state) == {"n": 1}
    assert h.calls.produced(DLQ) == [] and len(h.calls.produced(OUTPUT)) == 1
    assert len(sleeps) == 2


def test_a_business_exception_is_dead_lettered_with_its_type(sleeps: list[float]) -> None:
    h = Harness(processing_max_attempts=2)
    task = h.task(committed=0)
    bad = kafka_message(0, b"acct", orjson.dumps({"id": "x", "amount": "12"}), partition=P)
    task.process([bad])
    [letter] = h.calls.produced(DLQ)
    assert dlq_headers(letter)["eos.dlq.error.type"] == b"TypeError"
    assert dlq_headers(letter)["eos.dlq.attempts"] == b"2"
    assert dict(task.state) == {}


def test_on_poison_stop_raises_and_the_position_stays_at_the_poison_record(sleeps: list[float]) -> None:
    h = Harness(on_poison="stop", processing_max_attempts=2)
    task = h.task(committed=10)
    with pytest.raises(PoisonRecordStop, match=r"in\[2\]@11 failed 2 times: SerdeError"):
        task.process([msg(10), poison(11), msg(12)])
    assert task.next_offset == 11
    assert h.calls.produced(DLQ) == []
    assert [r["headers"][-1] for r in h.calls.produced(OUTPUT)] == [(SOURCE_HEADER, encode_source(P, 10))]
    assert dict(task.state) == {"acct": [1, 1]}
    h.commit(task)  # what came before the poison record is kept (the runner does this)
    [(offsets, _, _)] = [a for name, a, _ in h.calls if name == "send_offsets_to_transaction"]
    assert offsets[0].offset == 11  # never past the poison record


# -- close ------------------------------------------------------------------------------------------------------------
def test_close_with_commit_commits_the_open_transaction() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0), msg(1)])
    h.close(task, commit=True)
    names = h.calls.names()
    assert names.index("commit_transaction") < len(names) - 1 - names[::-1].index("flush")  # the last flush after
    assert "abort_transaction" not in names
    assert task.committed_offset == 2 and task.phase is Phase.CLOSED
    h.close(task, commit=True)  # idempotent
    assert h.calls.names() == names


def test_close_without_commit_aborts_the_open_transaction() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.close(task, commit=False)
    assert h.calls.names()[-2:] == ["abort_transaction", "flush"]
    assert "commit_transaction" not in h.calls.names()
    assert task.committed_offset == 0


def test_close_never_raises_when_abort_and_flush_fail() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail("abort_transaction", kafka_exception(**FENCED))
    h.producers[0].fail("flush", kafka_exception(**FENCED))
    h.close(task, commit=False)
    assert h.calls.names()[-2:] == ["abort_transaction", "flush"]
    assert task.phase is Phase.CLOSED


def test_close_of_a_dropped_task_does_not_flush_its_broken_producer_and_survives_a_failing_flush() -> None:
    """A paused member, fenced on waking, lost its partition in the same poll: the flush of its fatal producer inside
    the rebalance callback raised SystemError (around the KafkaException), and the worker died."""
    h = Harness()
    task = commit_failed(h, "send_offsets_to_transaction", FENCED, PartitionDropped)
    task.drop("fenced")
    h.close(task, commit=False)
    assert "flush" not in h.calls.names() and task.phase is Phase.CLOSED
    h = Harness()
    task = h.task(committed=0)
    h.producers[0].fail("flush", SystemError("<built-in function len> returned a result with an exception set"))
    h.close(task, commit=False)
    assert h.calls.names() == ["flush"] and task.phase is Phase.CLOSED


@pytest.mark.parametrize("error", [FENCED, ABORTABLE], ids=["fenced", "abortable"])
def test_close_never_raises_when_the_commit_abort_and_flush_fail(error: dict) -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    producer = h.producers[0]
    producer.fail("commit_transaction", kafka_exception(**error))
    producer.fail("abort_transaction", kafka_exception(**FENCED))
    producer.fail("flush", None, kafka_exception(**FENCED))  # the flush before the commit goes through
    h.close(task, commit=True)
    assert task.phase is Phase.CLOSED and task.committed_offset == 0
    assert h.calls.count("commit_transaction") == 1


# -- bugs -------------------------------------------------------------------------------------------------------------
def test_close_never_raises_when_produce_fails_during_the_closing_commit() -> None:
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail("produce", kafka_exception(KafkaError._FATAL, fatal=True))
    h.close(task, commit=True)
    assert task.phase is Phase.CLOSED and task.committed_offset == 0


@pytest.mark.parametrize("step", ["process", "commit"])
def test_a_fatal_error_from_produce_drops_the_partition(step: str) -> None:
    h = Harness()
    task = h.task(committed=0)
    if step == "commit":
        task.process([msg(0)])
    h.producers[0].fail("produce", kafka_exception(KafkaError._FATAL, fatal=True))
    with pytest.raises(PartitionDropped):
        if step == "commit":
            h.commit(task)
        else:
            task.process([msg(0)])


def test_the_quick_fence_goes_before_init_transactions_on_every_fence_and_renewal() -> None:
    """pipeline/kafka/kafka_python.py: it only helps if it comes first (librdkafka's init is the fence that counts)."""
    calls: list[str] = []
    producers = iter([_RecordingProducer(calls, "first"), _RecordingProducer(calls, "renewed")])
    renew, quick = (lambda: next(producers)), (lambda: calls.append("quick"))
    txn = Transaction(next(producers), Settings(), "process", renew_with=renew, quick_fence=quick)  # type: ignore[arg-type]
    txn.fence()
    txn.renew()
    assert calls == ["quick", "first init", "quick", "renewed init"]


class _RecordingProducer:
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def init_transactions(self, timeout: float) -> None:
        self.calls.append(f"{self.name} init")


def test_a_take_over_of_a_few_ids_gets_the_quick_fence_and_a_start_with_many_does_not() -> None:
    """Per partition, a crashed peer's few partitions are fenced quickly; 384 kafka-python clients at once would cost
    more than they save (pipeline/sinks/kafka/takeover.py: QUICK_FENCE_AT_MOST)."""

    def txns(count: int, calls: list[str]) -> list[Transaction]:
        def made(i: int) -> Transaction:
            producer = types.SimpleNamespace(init_transactions=lambda timeout: calls.append(f"init {i}"))
            quick = lambda: calls.append(f"quick {i}")  # noqa: E731
            return Transaction(producer, Settings(), f"p{i}", quick_fence=quick)  # type: ignore[arg-type]

        return [made(i) for i in range(count)]

    few: list[str] = []
    takeover.fence(txns(takeover.QUICK_FENCE_AT_MOST, few), Settings())
    assert all(few.index(f"quick {i}") < few.index(f"init {i}") for i in range(takeover.QUICK_FENCE_AT_MOST))
    many: list[str] = []
    takeover.fence(txns(takeover.QUICK_FENCE_AT_MOST + 1, many), Settings())
    assert not [call for call in many if call.startswith("quick")] and len(many) == takeover.QUICK_FENCE_AT_MOST + 1
