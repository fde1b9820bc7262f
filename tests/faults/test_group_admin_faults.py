"""GroupAdmin (kafka-python) after the group's coordinator died: the failure detector's removals, the coverage look
and the standby placement read and change the group through it, for the whole life of the process. kafka-python
3.0's admin client looked the coordinator up once and kept it, so after a broker fault every call failed or was
answered NOT_COORDINATOR until the process restarted. On the local 3-node cluster (pipeline/kafka/kafka_python.py).

And a run with standby copies under KIP-848 through a kill of each broker in turn: its placement read the group through
librdkafka's admin client, whose coordinator look-up aborted whole processes when the coordinator's broker died."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.examples.running_totals import app as totals
from pipeline.kafka.kafka_python import GroupAdmin, GroupAnswer
from pipeline.settings import Settings
from pipeline.testing import inputs
from pipeline.testing.faults import FaultRun
from tests.faults.conftest import assert_exactly_once
from tests.faults.test_broker_faults import running
from tests.support import eventually

pytestmark = pytest.mark.cluster
PARTITIONS = 3


@pytest.fixture
def member(kafka_cluster) -> Iterator[tuple[str, str, Consumer]]:
    """A topic replicated three times and a group of one plain member that owns all of it: (topic, group, member)."""
    topic, group = f"coordinator-{uuid.uuid4().hex[:8]}", f"coordinator-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group, "session.timeout.ms": 45_000})
    consumer.subscribe([topic])
    eventually(lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == PARTITIONS, 60, 0.1)
    yield topic, group, consumer
    consumer.close()
    admin.delete_topics([topic])


def coordinator_of(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures die with it
    return int(admin.describe_consumer_groups([group])[group].result(10).coordinator.id)


def test_the_group_is_read_and_changed_again_after_its_coordinator_died(kafka_cluster, member) -> None:
    topic, group, consumer = member
    admin = GroupAdmin(Settings(bootstrap_servers=kafka_cluster.bootstrap, request_timeout_ms=3_000), group)
    state, members, partitions = admin.describe(topic)
    assert (state, [m.partitions for m in members], partitions) == ("Stable", [frozenset(range(PARTITIONS))], 3)
    node = coordinator_of(kafka_cluster.bootstrap, group)
    kafka_cluster.kill(node)
    try:

        def read_again() -> GroupAnswer | None:
            consumer.poll(0.1)  # the member finds the new coordinator and stays in the group
            try:
                answer = admin.describe(topic)
            except Exception:
                return None
            return answer if answer[0] == "Stable" and answer[1] else None

        state, members, _ = eventually(read_again, 90, 0.5)
        assert coordinator_of(kafka_cluster.bootstrap, group) != node
        (only,) = members
        assert admin.remove(only.member_id, only.instance_id) == "NoError"  # the removal reaches the new coordinator
    finally:
        kafka_cluster.restart(node)
        admin.close()


def test_standbys_under_kip848_ride_each_broker_killed_in_turn(kafka_cluster, tmp_path, monkeypatch) -> None:
    """Two instances, one standby copy each, GROUP_PROTOCOL=consumer; each broker killed and restarted in turn while
    the input flows. Exactly once, no instance exits by itself (an abort would), and the copies were warmed."""
    monkeypatch.setenv("PIPELINE_GROUP_PROTOCOL", "consumer")
    monkeypatch.setenv("PIPELINE_STANDBY_REPLICAS", "1")
    run = FaultRun(
        totals,
        "pipeline.examples.running_totals:app",
        kafka_cluster.bootstrap,
        PARTITIONS,
        tmp_path / "logs",
        replication=3,
    )
    try:
        run.feed(list(inputs.running_totals_records(20_000, partitions=PARTITIONS, seed=17)), seconds=20)
        run.start(2)
        running(kafka_cluster.bootstrap, run)
        for node in (1, 2, 3):
            time.sleep(2)
            kafka_cluster.kill(node)
            time.sleep(2)
            kafka_cluster.restart(node)
        outcome = run.finish(timeout_s=180)
        assert_exactly_once(outcome)
        logs = "".join(log.read_text() for log in (tmp_path / "logs").rglob("*.log"))  # outcome.logs holds tails
        assert "standby copy warm" in logs
    finally:
        run.abandon()
