"""The checker against a real broker: a run written by hand (transactional producers and
send_offsets_to_transaction, no runner) passes when correct, and each injected defect is found precisely.
Aborted transactions must not count. These prove the checker can fail."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from support import eventually

from pipeline.app import App
from pipeline.core.deadletter import DeadLetter
from pipeline.core.provenance import SOURCE_HEADER, encode_source
from pipeline.examples import running_totals
from pipeline.kafka.offsets import ReadToEndTimeout
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.testing.checker import main, verify
from pipeline.testing.drain import drain_topic, observe
from pipeline.testing.inputs import create_topics, produce_running_totals
from pipeline.testing.oracle import KafkaRecord, Verdict, observer_subset_of_final

pytestmark = pytest.mark.timeout(120)

INPUTS, PARTITIONS, POISON_EVERY = 40, 2, 9  # poison: ids 8, 17, 26, 35
RECORDS_PER_TXN = 4


@dataclass
class Produced:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class Txn:
    input_partition: int
    records: list[Produced]
    commit_offset: int  # the next input offset sent with the transaction
    abort: bool = False


@dataclass
class Setup:
    bootstrap: str
    app: App
    inputs: list[KafkaRecord]

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.app.name}-dlq"

    @property
    def changelog_topic(self) -> str:
        return f"{self.app.name}-changelog"


@pytest.fixture
def setup(kafka_bootstrap: str) -> Setup:
    name = f"checker-{uuid.uuid4().hex[:10]}"
    app = replace(running_totals.app, name=name, input_topic=f"{name}-in", output_topic=f"{name}-out")
    topics = [app.input_topic, app.output_topic, f"{name}-dlq", f"{name}-changelog"]
    create_topics(kafka_bootstrap, dict.fromkeys(topics, PARTITIONS))
    counts = produce_running_totals(
        kafka_bootstrap, app.input_topic, INPUTS, partitions=PARTITIONS, accounts=5, seed=3, poison_every=POISON_EVERY
    )
    assert sum(counts.values()) == INPUTS and all(counts.values())
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    inputs = drain_topic(admin, {"bootstrap.servers": kafka_bootstrap}, app.input_topic, 30).records
    return Setup(kafka_bootstrap, app, inputs)


# -- a correct run, computed independently of the checker (plain json, plain dicts) ---------------------------------
def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def correct_transactions(setup: Setup) -> list[Txn]:
    """What a correct runner writes: per input partition, transactions of RECORDS_PER_TXN records each holding
    the outputs (to the output partition = input partition), dead letters, changed state and a checkpoint."""
    txns = []
    totals: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        records = sorted((r for r in setup.inputs if r.partition == p), key=lambda r: r.offset)
        for start in range(0, len(records), RECORDS_PER_TXN):
            txns.append(_transaction(setup, p, records[start : start + RECORDS_PER_TXN], totals))
    return txns


def _transaction(setup: Setup, p: int, chunk: list[KafkaRecord], totals: dict[bytes, tuple[int, int]]) -> Txn:
    produced, changed = [], {}
    for record in chunk:
        try:
            value = json.loads(record.value)
            if not isinstance(value["amount"], int):
                raise TypeError("amount")
        except (ValueError, TypeError) as e:
            letter = DeadLetter(setup.app.input_topic, p, record.offset, record.key, record.value, "E", str(e), 3)
            produced.append(Produced(setup.dead_letter_topic, p, record.key, record.value, letter.headers()))
            continue
        count, total = totals.get(record.key, (0, 0))
        totals[record.key] = changed[record.key] = (count + 1, total + value["amount"])
        out = compact({"id": value["id"], "count": count + 1, "sum": total + value["amount"]})
        source = [(SOURCE_HEADER, encode_source(p, record.offset))]
        produced.append(Produced(setup.app.output_topic, p, record.key, out, source))
    produced += [Produced(setup.changelog_topic, p, key, compact(list(v))) for key, v in changed.items()]
    next_offset = chunk[-1].offset + 1
    checkpoint = Checkpoint(setup.app.input_topic, p, next_offset).encode()
    produced.append(Produced(setup.changelog_topic, p, CHECKPOINT_KEY, checkpoint, [CHECKPOINT_HEADER]))
    return Txn(p, produced, next_offset)


def write(setup: Setup, txns: list[Txn]) -> None:
    """One transactional.id per input partition, as the runner does; offsets go into the transaction."""
    group = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": setup.app.name})
    metadata = group.consumer_group_metadata()
    producers: dict[int, Producer] = {}
    for txn in txns:
        producer = producers.get(txn.input_partition) or _producer(setup, txn.input_partition)
        producers[txn.input_partition] = producer
        producer.begin_transaction()
        for r in txn.records:
            producer.produce(r.topic, value=r.value, key=r.key, partition=r.partition, headers=r.headers)
        offsets = [TopicPartition(setup.app.input_topic, txn.input_partition, txn.commit_offset)]
        producer.send_offsets_to_transaction(offsets, metadata, 30)
        if txn.abort:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    group.close()


def _producer(setup: Setup, p: int) -> Producer:
    producer = Producer(
        {"bootstrap.servers": setup.bootstrap, "transactional.id": f"{setup.app.name}.{setup.app.input_topic}.{p}"}
    )
    producer.init_transactions(30)
    return producer


def run_verify(setup: Setup) -> Verdict:
    return verify(setup.app, setup.bootstrap, timeout_s=30)


def problem_counts(verdict: Verdict) -> dict[str, int]:
    names = ("duplicates", "losses", "order", "content", "state", "offsets")
    return {name: verdict.findings(name).count for name in names if verdict.findings(name).count}


# -- the defects ---------------------------------------------------------------------------------------------------
def outputs_of(txn: Txn, setup: Setup) -> list[Produced]:
    return [r for r in txn.records if r.topic == setup.app.output_topic]


def first_txn_with_two_outputs(txns: list[Txn], setup: Setup) -> Txn:
    return next(t for t in txns if len(outputs_of(t, setup)) >= 2)


def duplicate_an_output(txns: list[Txn], setup: Setup) -> None:
    txn = first_txn_with_two_outputs(txns, setup)
    later = [t for t in txns if t.input_partition == txn.input_partition][-1]
    later.records.insert(0, replace(outputs_of(txn, setup)[0]))


def drop_an_output(txns: list[Txn], setup: Setup) -> None:
    txn = first_txn_with_two_outputs(txns, setup)
    txn.records.remove(outputs_of(txn, setup)[1])


def swap_two_outputs(txns: list[Txn], setup: Setup) -> None:
    txn = first_txn_with_two_outputs(txns, setup)
    first, second = outputs_of(txn, setup)[:2]
    i, j = txn.records.index(first), txn.records.index(second)
    txn.records[i], txn.records[j] = second, first


def commit_one_short(txns: list[Txn], setup: Setup) -> None:
    last_of_p0 = [t for t in txns if t.input_partition == 0][-1]
    last_of_p0.commit_offset -= 1


def add_aborted_duplicates(txns: list[Txn], setup: Setup) -> None:
    """Replays of committed transactions that abort (with an absurd offset commit), in the middle and at the end."""
    first, last = txns[0], txns[-1]
    txns.insert(1, replace(first, records=list(first.records), commit_offset=0, abort=True))
    txns.append(replace(last, records=list(last.records), commit_offset=10_000, abort=True))


DEFECTS: dict[str, tuple[Callable[[list[Txn], Setup], None], dict[str, int]]] = {
    "duplicated-output": (duplicate_an_output, {"duplicates": 1}),
    "missing-output": (drop_an_output, {"losses": 1}),
    "swapped-order": (swap_two_outputs, {"order": 1}),
    "committed-offset-one-short": (commit_one_short, {"offsets": 1}),
    "aborted-duplicates-do-not-count": (add_aborted_duplicates, {}),
}


# -- tests -------------------------------------------------------------------------------------------------------------
def test_a_correct_run_written_by_hand_is_ok(setup: Setup):
    write(setup, correct_transactions(setup))

    verdict = run_verify(setup)

    assert verdict.ok, verdict.summary()
    assert (verdict.inputs, verdict.outputs, verdict.dead_letters) == (INPUTS, 36, 4)


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_is_found_precisely(setup: Setup, defect: str):
    inject, expected = DEFECTS[defect]
    txns = correct_transactions(setup)
    inject(txns, setup)
    write(setup, txns)

    verdict = run_verify(setup)

    assert problem_counts(verdict) == expected, verdict.summary()


def test_the_observer_sees_nothing_that_the_final_drain_lacks(setup: Setup):
    txns = correct_transactions(setup)
    add_aborted_duplicates(txns, setup)
    observer = observe(setup.bootstrap, setup.app.output_topic)
    try:
        write(setup, txns)
        eventually(lambda: len(observer.records) >= 36, timeout_s=30)
    finally:
        observed = observer.stop()

    verdict = run_verify(setup)

    assert verdict.ok, verdict.summary()
    assert len(observed) == verdict.outputs == 36
    assert observer_subset_of_final(observed, verdict) == []
    assert observer.errors == []


def test_an_open_transaction_makes_verify_fail_in_bounded_time(setup: Setup):
    write(setup, correct_transactions(setup))
    producer = _producer(setup, 0)
    producer.begin_transaction()
    producer.produce(setup.app.output_topic, value=b"pending", partition=0)
    producer.flush(10)
    try:
        with pytest.raises(ReadToEndTimeout, match=setup.app.output_topic):
            verify(setup.app, setup.bootstrap, timeout_s=3)
    finally:
        producer.abort_transaction(30)
    assert run_verify(setup).ok


def test_the_command_line_exits_0_when_ok_and_1_when_not(setup: Setup, capsys: pytest.CaptureFixture[str]):
    txns = correct_transactions(setup)
    write(setup, txns)
    argv = [
        "verify",
        "pipeline.examples.running_totals:app",
        f"--bootstrap-servers={setup.bootstrap}",
        f"--input-topic={setup.app.input_topic}",
        f"--output-topic={setup.app.output_topic}",
        f"--dead-letter-topic={setup.dead_letter_topic}",
        f"--changelog-topic={setup.changelog_topic}",
        f"--group-id={setup.app.name}",
        "--timeout=30",
    ]
    assert main(argv) == 0
    assert "exactly-once: OK" in capsys.readouterr().out

    last_of_p0 = [t for t in txns if t.input_partition == 0][-1]
    write(setup, [Txn(0, [outputs_of(last_of_p0, setup)[0]], last_of_p0.commit_offset)])
    assert main([*argv, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"]["duplicates"]["count"] == 1
