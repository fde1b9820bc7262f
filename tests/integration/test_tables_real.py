"""Several inputs and tables against a real broker: start-up refusals name the topics, a global table is complete
before the first record is processed, and a table goes on reading exactly where its restore ended (docs/inputs.md)."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline import settings
from pipeline.app import App, Output, Stream, Table
from pipeline.examples import order_fills
from pipeline.kafka.offsets import TailReader
from pipeline.metrics import Metrics
from pipeline.serde import BYTES
from pipeline.settings import ConfigError
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.state import global_tables
from pipeline.state.global_tables import GlobalTables
from pipeline.testing import inputs
from pipeline.testing.drain import drain_topic
from tests.integration.test_restore import running
from tests.support import eventually


def order_fills_app(bootstrap: str, partitions: dict[str, int] | None = None):
    suffix = f"-{uuid.uuid4().hex[:8]}"
    app = order_fills.app.with_topic_suffix(suffix)
    counts = {order_fills.ORDERS: 2, order_fills.FILLS: 2, order_fills.ACCOUNTS: 1, order_fills.OUTPUT: 2}
    counts |= partitions or {}  # 0: not created
    inputs.create_topics(bootstrap, {topic + suffix: n for topic, n in counts.items() if n})
    return app, f"tables{suffix}"


def runner_for(app, app_id: str, bootstrap: str) -> KafkaRunner:
    return KafkaRunner(app, settings.load(env={}, bootstrap_servers=bootstrap, app_id=app_id))


def keyed(n: int, start: int = 0) -> list[tuple[int, bytes, bytes]]:
    return [(0, b"k", str(i).encode()) for i in range(start, start + n)]


def test_inputs_with_different_partition_counts_are_refused_naming_both(kafka_bootstrap):
    app, app_id = order_fills_app(kafka_bootstrap, {order_fills.FILLS: 3})
    counts = r"same partition count: 'order-fills-orders-\w+' has 2, 'order-fills-fills-\w+' has 3"
    with pytest.raises(ConfigError, match=counts):
        runner_for(app, app_id, kafka_bootstrap).run()


def test_a_missing_table_topic_is_named(kafka_bootstrap):
    app, app_id = order_fills_app(kafka_bootstrap, {order_fills.ACCOUNTS: 0})
    with pytest.raises(ConfigError, match=r"order-fills-accounts-\w+.* does not exist"):
        runner_for(app, app_id, kafka_bootstrap).run()


def test_the_first_record_processed_sees_the_global_table_written_before_the_start(kafka_bootstrap):
    app, app_id = order_fills_app(kafka_bootstrap)
    accounts = app.global_table_specs["accounts"].topic
    desks = [(0, b"acct-1", json.dumps({"desk": f"desk-v{v}", "version": v}).encode()) for v in range(1, 201)]
    inputs.produce(kafka_bootstrap, accounts, desks, partitions=1)
    orders, fills = (s.topic for s in app.streams)
    inputs.produce(kafka_bootstrap, orders, [(0, b"o-1", b'{"account": "acct-1", "qty": 5}', 1000)], partitions=2)
    inputs.produce(kafka_bootstrap, fills, [(0, b"o-1", b'{"fill_id": "f", "qty": 2, "price": 1}', 1001)], partitions=2)
    with running(runner_for(app, app_id, kafka_bootstrap)):
        out = eventually(lambda: _drain(kafka_bootstrap, app.output_topic), 60)
    assert [json.loads(r.value)["desk_version"] for r in out] == [200]


def test_a_tail_reader_stops_at_the_end_even_when_it_fetched_records_beyond(kafka_bootstrap):
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    inputs.create_topics(kafka_bootstrap, {topic: 1})
    inputs.produce(kafka_bootstrap, topic, keyed(10), partitions=1)  # one fetch brings all ten
    reader = TailReader(_consumer(kafka_bootstrap), topic, {0: 0}, {0: 5})
    read = [m.offset() for m in _read(reader)]
    assert read == [0, 1, 2, 3, 4] and reader.positions == {0: 5}  # where a table goes on reading


def test_a_global_table_applies_what_was_written_during_its_restore(kafka_bootstrap, monkeypatch):
    """The high watermark is captured when the restore begins; records written after it come in the same fetches,
    are left out of the restore and must be read by the polls that follow (a fault run lost them once)."""
    topic = f"global-{uuid.uuid4().hex[:8]}"
    inputs.create_topics(kafka_bootstrap, {topic: 1})
    inputs.produce(kafka_bootstrap, topic, keyed(10), partitions=1)
    real = global_tables.high_watermarks
    monkeypatch.setattr(global_tables, "high_watermarks", lambda *a: {p: min(5, o) for p, o in real(*a).items()})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    tables = GlobalTables({"t": Table(topic)}, lambda: _consumer(kafka_bootstrap), admin, Metrics(), 10, 30)
    try:
        tables.restore()
        assert tables.views["t"].get("k") == 4
        eventually(lambda: tables.poll() == 0 and tables.views["t"].get("k") == 9, 20)
    finally:
        tables.close()


def _drain(bootstrap: str, topic: str) -> list:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return drain_topic(admin, {"bootstrap.servers": bootstrap}, topic, 10).records


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def _read(reader: TailReader) -> list:
    got: list = []
    while not reader.done:
        got += reader.step()
    return got


def test_a_one_input_app_declared_as_a_stream_reads_with_the_streams_serdes(kafka_bootstrap):
    """App(inputs=[Stream(t, BYTES, BYTES)]) is a one-input App, processed by the one-input fast path: its records are
    decoded by the Stream's serdes, not the App's defaults (red when the fast path took app.key_serde: every record
    failed to decode as JSON and came through only on its retry, a back-off later: a stream of them outlived the
    transaction time-out, and the producer was fenced)."""
    suffix = uuid.uuid4().hex[:8]
    source, out = f"bytes-in-{suffix}", f"bytes-out-{suffix}"
    inputs.create_topics(kafka_bootstrap, {source: 1, out: 1})
    inputs.produce(kafka_bootstrap, source, [(0, b"\xff\x00", b"\x80not json")], partitions=1)
    copy = lambda state, record: [Output(key=record.key, value=record.value)]  # noqa: E731
    app = App(
        "bytes",
        inputs=[Stream(source, BYTES, BYTES)],
        output_topic=out,
        process=copy,
        stateful=False,
        output_key_serde=BYTES,
        output_value_serde=BYTES,
    )
    with running(runner_for(app, f"bytes-{suffix}", kafka_bootstrap)) as runner:
        copied = eventually(lambda: _drain(kafka_bootstrap, out), 60)
    assert [(r.key, r.value) for r in copied] == [(b"\xff\x00", b"\x80not json")]
    assert _count(runner.metrics.processing_errors) == 0  # not decoded on its second try


def _count(counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
