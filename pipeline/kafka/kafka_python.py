"""What the runtime asks of kafka-python, where librdkafka cannot do it (removing a member from the group: a silent
one, pipeline/kafka/liveness.py; one making way for a rebalance, pipeline/kafka/coverage.py) or does it slowly (the
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

import logging
import time
from typing import Any, NamedTuple

from pipeline.settings import ConfigError, Settings

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


class GroupAdmin:
    """kafka-python's admin client for one consumer group, made at its first use: what librdkafka's admin cannot do
    (remove a member) or cannot do safely while brokers die (describe the group: librdkafka 2.16's coordinator
    look-up aborted both instances of a broker fault run, `rd_kafka_enq_once_del_source_return: Assertion
    eonce->refcnt > 0`, when the coordinator's broker went down under a DescribeConsumerGroups every 2 s). Blocking:
    call it from a thread of its own, never from the poll loop."""

    def __init__(self, settings: Settings, group: str) -> None:
        try:
            from kafka.admin import KafkaAdminClient, MemberToRemove
        except ImportError as e:
            raise ConfigError("removing a member from a group needs kafka-python (pip install kafka-python)") from e
        self._new_admin, self._member_to_remove = KafkaAdminClient, MemberToRemove
        self._config = {**kafka_python_config(settings), "request_timeout_ms": settings.request_timeout_ms}
        self._group = group
        self._admin: Any = None
        logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is a dozen connection lines per call

    def remove(self, member_id: str, instance_id: str) -> str:
        """The broker's answer to removing that member (LeaveGroup v3+; instance_id "" for a dynamic member)."""
        member = self._member_to_remove(member_id=member_id, group_instance_id=instance_id or None)
        result = self._client().remove_group_members(self._group, [member])
        return ", ".join(getattr(error, "__name__", str(error)) for error in result.values())

    def describe(self, topic: str) -> GroupAnswer:
        """The group's members and their partitions of `topic` (GroupAnswer)."""
        client = self._client()
        group = client.describe_groups([self._group])[self._group]
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
        (described,) = client.describe_topics([topic])
        return group["group_state"], members, len(described["partitions"])

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _client(self) -> Any:
        if self._admin is None:
            self._admin = self._new_admin(**self._config)
        return self._admin
