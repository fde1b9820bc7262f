"""What the runtime asks of kafka-python, where librdkafka cannot do it (removing a member from the group: a silent
one, pipeline/kafka/liveness.py; one making way for a rebalance, pipeline/kafka/coverage.py), cannot do it safely
(reading the group's assignment while brokers die: the coverage look, the standby placement) or does it slowly (the
fence below), and the mapping of the security settings to it.

A quicker fence of a transactional id whose last producer left a transaction open (issue 22).

init_transactions on such an id makes the transaction coordinator abort the open transaction, answering
CONCURRENT_TRANSACTIONS until the abort is complete. librdkafka 2.16 asks again only 500 ms later, whatever
retry.backoff.ms says: measured 0.506 s against 0.055 s with nothing open. That wait sat on the take-over paths of
PRODUCERS=per_process: a restarted worker's fence of its own id (the one the dead process used), the detector's fence
of a dead peer (the new owner's committed offsets wait for it), and the renewal after an abort. kafka-python's
InitProducerId asks again after its retry_backoff_ms: sent first, it completes the abort in 50-64 ms, and librdkafka's
own init_transactions then takes 55 ms.

Best effort: if it fails (an unmappable security setting, the broker, anything), librdkafka's init_transactions
does the whole fence as before. Correctness never rests on it: producer epochs only go up, and librdkafka's init,
which comes after it, is the fence that counts (docs/guarantees.md: fence-first)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from pipeline.settings import CONSUMER, ConfigError, Settings

log = logging.getLogger(__name__)
RETRY_BACKOFF_MS = 20
QUICK_FENCE_BOUND_MS = 1_000  # its connect, and its init_transactions, each give up after this long
# librdkafka property -> kafka-python admin argument: what a secured cluster needs to reach the group coordinator.
KAFKA_PYTHON_CONFIG = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
}


def kafka_python_config(settings: Settings) -> dict[str, Any]:
    """The kafka-python clients' configuration; ConfigError naming FAILURE_DETECTION_MS for a security property it
    cannot be given (it would fail to connect, and detection would be silently off; the quick fence only skips)."""
    config: dict[str, Any] = {"bootstrap_servers": settings.bootstrap_servers.split(",")}
    for name, value in settings.kafka.items():
        if name in KAFKA_PYTHON_CONFIG:
            config[KAFKA_PYTHON_CONFIG[name]] = str(value)
        elif name == "ssl.endpoint.identification.algorithm":  # common beside a private CA; "none" or "https"
            config["ssl_check_hostname"] = str(value).lower() != "none"
        elif name.startswith(("sasl.", "ssl.")):
            raise ConfigError(
                f"FAILURE_DETECTION_MS: the Kafka property {name} cannot be passed to the group admin client "
                f"(supported: {', '.join(sorted(KAFKA_PYTHON_CONFIG))}, ssl.endpoint.identification.algorithm); "
                "set FAILURE_DETECTION_MS=0 (fast failure detection off) or use those"
            )
    return config


def quick_fence(settings: Settings, transactional_id: str) -> None:
    """An InitProducerId for `transactional_id` through kafka-python, which aborts what its last producer left open
    sooner than librdkafka would; nothing if it cannot be done."""
    started = time.monotonic()
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is a dozen connection lines per producer
    try:
        from kafka import KafkaProducer

        config = kafka_python_config(settings)
        producer = KafkaProducer(
            **config,
            transactional_id=transactional_id,
            retry_backoff_ms=RETRY_BACKOFF_MS,
            # Bounded tightly: it saves at most ~0.45 s, and without these a broker it cannot reach held it 30 s.
            bootstrap_timeout_ms=min(settings.request_timeout_ms, QUICK_FENCE_BOUND_MS),
            request_timeout_ms=settings.request_timeout_ms,
            max_block_ms=min(settings.request_timeout_ms, QUICK_FENCE_BOUND_MS),
        )
    except (ImportError, ConfigError) as e:
        log.debug("%s: no quick fence (%s)", transactional_id, e)
        return
    except Exception as e:  # connecting failed: librdkafka's own fence will say why, with its retries
        log.info("%s: quick fence not started (%s); the fence goes on without it", transactional_id, e)
        return
    try:
        producer.init_transactions()
        log.debug("%s: quick fence in %.0f ms", transactional_id, 1000 * (time.monotonic() - started))
    except Exception as e:
        log.info("%s: quick fence failed (%s); the fence goes on without it", transactional_id, e)
    finally:
        producer.close(timeout=1)


class GroupMember(NamedTuple):
    member_id: str
    instance_id: str  # "" for a dynamic member
    partitions: frozenset[int]  # of the one topic asked about

    @property
    def name(self) -> str:
        """What the group calls it for good: its static id, else its member id."""
        return self.instance_id or self.member_id


# The group's state ("Stable", ...), its members, and the topic's partition count: GroupAdmin.describe
GroupAnswer = tuple[str, list[GroupMember], int]
Answer = TypeVar("Answer")
# How kafka-python names the errors that say the group's coordinator is elsewhere (or not there yet).
COORDINATOR_MOVED = ("NotCoordinatorError", "CoordinatorNotAvailableError", "CoordinatorLoadInProgressError")


def moved(answer: str) -> bool:
    """The answer names an error that says the coordinator is elsewhere."""
    return any(name in answer for name in COORDINATOR_MOVED)


def group_error(error: str) -> Exception:
    """An error the group answered: CoordinatorMoved (asked again, GroupAdmin._at_coordinator) or GroupUnreadable."""
    return (CoordinatorMoved if moved(error) else GroupUnreadable)(error)


def partition_count(client: Any, topic: str) -> int:
    (described,) = client.describe_topics([topic])
    return len(described["partitions"])


def kafka_error_name(code: int) -> str:
    import kafka.errors

    return str(kafka.errors.for_code(code).__name__)


@functools.cache
def consumer_group_describe() -> tuple[Any, Any]:
    """KIP-848's ConsumerGroupDescribe request and response classes. kafka-python 3.0 knows its API key but defines
    neither message: kafka-python's own machinery builds both from the schemas in pipeline/kafka/protocol/."""
    from kafka.protocol.api_message import ApiMessage

    from pipeline.kafka import protocol

    class ConsumerGroupDescribeRequest(ApiMessage, load_json=protocol):  # type: ignore[misc, call-arg]
        pass

    class ConsumerGroupDescribeResponse(ApiMessage, load_json=protocol):  # type: ignore[misc, call-arg]
        pass

    # kafka-python finds the answer's class through a weak reference: the cache keeps it alive.
    return ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse


class CoordinatorMoved(Exception):
    """The answer came from a broker that is not, or not yet, the group's coordinator."""


class GroupUnreadable(Exception):
    """The coordinator answered the group with an error (GroupAuthorizationFailed, say): asking again cannot help."""


class GroupAdmin:
    """kafka-python's admin client for one consumer group, made at its first use: what librdkafka's admin cannot do
    (remove a member) or cannot do safely while brokers die (describe the group: librdkafka 2.16's coordinator
    look-up aborted both instances of a broker fault run, `rd_kafka_enq_once_del_source_return: Assertion
    eonce->refcnt > 0`, when the coordinator's broker went down under a DescribeConsumerGroups every 2 s), in both
    group protocols. Blocking: call it from a thread of its own, never from the poll loop."""

    def __init__(self, settings: Settings, group: str) -> None:
        try:
            from kafka.admin import KafkaAdminClient, MemberToRemove
        except ImportError as e:
            raise ConfigError("removing a member from a group needs kafka-python (pip install kafka-python)") from e
        self._new_admin, self._member_to_remove = KafkaAdminClient, MemberToRemove
        self._config = {**kafka_python_config(settings), "request_timeout_ms": settings.request_timeout_ms}
        self._group = group
        self._kip848 = settings.group_protocol == CONSUMER
        self._admin: Any = None
        logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is a dozen connection lines per call

    def remove(self, member_id: str, instance_id: str) -> str:
        """The broker's answer to removing that member (LeaveGroup v3+; instance_id "" for a dynamic member)."""
        member = self._member_to_remove(member_id=member_id, group_instance_id=instance_id or None)

        def ask(client: Any) -> str:
            result = client.remove_group_members(self._group, [member])
            answer = ", ".join(getattr(error, "__name__", str(error)) for error in result.values())
            if moved(answer):
                raise CoordinatorMoved(answer)
            return answer

        return self._at_coordinator(ask)

    def describe(self, topic: str) -> GroupAnswer:
        """The group's members and their partitions of `topic` (GroupAnswer); an error the group answered raises.
        Under GROUP_PROTOCOL=consumer, KIP-848's ConsumerGroupDescribe (the classic DescribeGroups sees no member of
        such a group)."""
        read = self._described_848 if self._kip848 else self._described_classic
        return self._at_coordinator(lambda client: (*read(client, topic), partition_count(client, topic)))

    def _described_classic(self, client: Any, topic: str) -> tuple[str, list[GroupMember]]:
        group = client.describe_groups([self._group])[self._group]
        if error := group.get("error"):
            raise group_error(error)
        members = [
            GroupMember(
                m["member_id"],
                m.get("group_instance_id") or "",
                frozenset(
                    p
                    for assigned in (m.get("member_assignment") or {}).get("assigned_partitions", [])
                    if assigned["topic"] == topic
                    for p in assigned["partitions"]
                ),
            )
            for m in group.get("members", [])
        ]
        return group["group_state"], members

    def _described_848(self, client: Any, topic: str) -> tuple[str, list[GroupMember]]:
        async def ask() -> Any:  # kafka-python's own coordinator look-up and connection (private, pinned: 3.0)
            coordinator = await client._find_coordinator_id(self._group)
            request = consumer_group_describe()[0](group_ids=[self._group], include_authorized_operations=False)
            return await client._manager.send(request, node_id=coordinator)

        (group,) = client._manager.run(ask).groups
        if group.error_code:
            error = f"{kafka_error_name(group.error_code)}: {group.error_message or ''}"
            raise group_error(error)
        members = [
            GroupMember(
                m.member_id,
                m.instance_id or "",
                frozenset(
                    p for tps in m.assignment.topic_partitions if tps.topic_name == topic for p in tps.partitions
                ),
            )
            for m in group.members
        ]
        return group.group_state, members

    def _at_coordinator(self, ask: Callable[[Any], Answer]) -> Answer:
        """`ask(client)`, once more through a new client if it failed. kafka-python 3.0's admin client looks a group's
        coordinator up once and keeps it for good: after the coordinator's broker died, or the group moved, every call
        went to the old one and failed, or was answered NOT_COORDINATOR, for as long as the process lived (the
        failure detector's removals, the coverage look and the standby placement all went blind). A new client looks
        the coordinator up again."""
        try:
            return ask(self._client())
        except GroupUnreadable:
            raise
        except Exception as first:
            self.close()
            log.info("group %s: %s; asking its coordinator anew", self._group, first)
            return ask(self._client())

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            with contextlib.suppress(Exception):  # a client whose broker died may fail its own close
                admin.close()

    def _client(self) -> Any:
        if self._admin is None:
            self._admin = self._new_admin(**self._config)
        return self._admin
