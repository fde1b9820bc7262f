"""GroupAdmin reads a group's assignment in both group protocols, on a real broker (pipeline/kafka/kafka_python.py).

Under GROUP_PROTOCOL=consumer it asks KIP-848's ConsumerGroupDescribe, whose messages this project defines for
kafka-python (pipeline/kafka/protocol/): the classic DescribeGroups sees no member of such a group. The standby
placement reads the group so in both protocols (pipeline/sinks/kafka/takeover.py)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.kafka_python import GroupAdmin, GroupUnreadable
from pipeline.settings import CLASSIC, CONSUMER, Settings
from tests.support import eventually

pytestmark = pytest.mark.kafka
PARTITIONS = 3


@pytest.mark.parametrize("protocol", [CLASSIC, CONSUMER])
def test_the_members_and_their_partitions_are_read_in_either_protocol(kafka_bootstrap: str, protocol: str) -> None:
    topic, group = f"admin-{uuid.uuid4().hex[:8]}", f"admin-{uuid.uuid4().hex[:8]}"
    kafka_admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept: its futures die with it
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "group.protocol": protocol}
        | ({"group.instance.id": "the-one"} if protocol == CONSUMER else {})
    )
    consumer.subscribe([topic])
    admin = GroupAdmin(Settings(bootstrap_servers=kafka_bootstrap, group_protocol=protocol), group)
    try:
        eventually(lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == PARTITIONS, 60, 0.1)

        def read() -> tuple[str, list[tuple[str, frozenset[int]]], int] | None:
            consumer.poll(0.1)
            state, members, partitions = admin.describe(topic)
            found = [(m.instance_id, m.partitions) for m in members]
            return (state, found, partitions) if state == "Stable" and found[0][1] else None

        state, found, partitions = eventually(read, 30, 0.2)
        instance = "the-one" if protocol == CONSUMER else ""
        assert (state, found, partitions) == ("Stable", [(instance, frozenset(range(PARTITIONS)))], PARTITIONS)
        assert found and members_named(admin, topic)
    finally:
        consumer.close()
        admin.close()


def members_named(admin: GroupAdmin, topic: str) -> bool:
    """Every member has a name (its static id, else its member id): what the placement ranks them by."""
    return all(m.name for m in admin.describe(topic)[1])


def test_a_group_that_cannot_be_read_raises_instead_of_answering_no_member(kafka_bootstrap: str) -> None:
    """Under KIP-848, an unknown group is GROUP_ID_NOT_FOUND: an error, never an empty group (the standby placement
    would drop every copy it keeps)."""
    admin = GroupAdmin(Settings(bootstrap_servers=kafka_bootstrap, group_protocol=CONSUMER), f"no-{uuid.uuid4().hex}")
    try:
        with pytest.raises(GroupUnreadable, match="GroupIdNotFound"):
            admin.describe("any-topic")
    finally:
        admin.close()
