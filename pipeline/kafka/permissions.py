"""Start-up check of the principal's permissions, so that a missing ACL fails at once, naming the operation and the
resource.

Without it a missing ACL shows up late and disguised: a topic the principal may not DESCRIBE looks absent ("does not
exist"), a changelog it may not READ makes restores retry "no leaders found" until their time-out, a group it may
not READ leaves the consumer warning forever, and a dead-letter topic it may not WRITE is noticed only by the first
poison record, inside a transaction. The brokers say what the principal may do with each topic and group
(authorized operations, KIP-430): compare that with what pipeline/kafka/acls.py says the service needs. A topic
that does not exist yet says nothing about itself: CREATE on it is asked with a validate-only CreateTopics, which
the broker authorizes exactly like the real one and then forgets.

Two phases, around the runner's topic check (pipeline/kafka/topics.py: ensure_topics):
    BEFORE_TOPICS  the group, every topic that exists, and CREATE on the internal topics that do not exist yet
    AFTER_TOPICS   the topics again, now that the internal ones exist (a principal may create a topic and still
                   lack READ or WRITE on it)

Transactional ids cannot be described this way; a missing transactional-id ACL fails the fence
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and `missing_transactional_id` turns that into the same kind of message.
Only authorization failures count: any other error of the check (a broker too old to report authorized operations,
a time-out) leaves the decision to the steps that follow, as they decided before the check existed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

from pipeline.kafka.acls import Acl, Names, service_acls
from pipeline.retry import Backoff, retry
from pipeline.settings import ConfigError, Settings

log = logging.getLogger(__name__)
BEFORE_TOPICS = "before-topics"
AFTER_TOPICS = "after-topics"
HINT = "Grant it (deploy/SECURITY.md; `pipeline acls MODULE:ATTR` prints the commands) and start again"
_DENIED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
)


class MissingPermission(ConfigError):
    """The principal lacks an ACL the service needs; the message names the operation and the resource."""


def check_service(admin: AdminClient, names: Names, settings: Settings, *, stateful: bool, phase: str) -> None:
    """Raises MissingPermission naming every operation on a topic or group that the service needs and the principal
    may not perform. `phase`: BEFORE_TOPICS (before ensure_topics) or AFTER_TOPICS (after it)."""
    if phase not in (BEFORE_TOPICS, AFTER_TOPICS):
        raise ValueError(f"phase must be {BEFORE_TOPICS!r} or {AFTER_TOPICS!r}, not {phase!r}")
    principal = settings.kafka.get("sasl.username")
    check(
        admin,
        service_acls(names, settings, stateful=stateful),
        settings.request_timeout_ms / 1000,
        before_topics=phase == BEFORE_TOPICS,
        principal=f"sasl.username {principal!r}" if principal else "",
    )


def check(
    admin: AdminClient, needed: Sequence[Acl], timeout_s: float, *, before_topics: bool = True, principal: str = ""
) -> None:
    """Raises MissingPermission naming every topic or group operation of `needed` the principal may not perform;
    with `before_topics`, also CREATE on the topics that do not exist and the groups."""

    def ask() -> list[str]:
        gaps = _topic_gaps(admin, needed, timeout_s, before_topics)
        if before_topics:
            gaps += _group_gaps(admin, [a for a in needed if a.resource == "group"], timeout_s)
        return gaps

    def warn(error: Exception, failures: int, delay: float | None) -> None:
        if delay is not None:
            log.warning("permission check: no answer within %.0fs; asking once more", timeout_s)

    try:  # asked twice: one broker of several restarting must not fail the start
        no_answer = lambda e: isinstance(e, TimeoutError)  # noqa: E731
        gaps = retry(ask, retriable=no_answer, backoff=Backoff(0.0), attempts=2, on_failure=warn)
    except TimeoutError as e:  # no broker answered: the same bounded, clear error as the topic checks give
        raise ConfigError(
            f"BOOTSTRAP_SERVERS: no cluster metadata within {timeout_s:.0f}s, asked twice (the "
            "permission check got no answer)"
        ) from e
    if gaps:
        raise MissingPermission(
            f"missing Kafka permission{'s' if len(gaps) > 1 else ''}"
            f"{f' ({principal})' if principal else ''}: {'; '.join(gaps)}. {HINT}"
        )


def missing_transactional_id(error: KafkaError, transactional_id: str) -> MissingPermission | None:
    """The clear form of a fence that failed for want of a transactional-id ACL, or None for other errors."""
    if error.code() != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return None
    return MissingPermission(
        f"missing Kafka permission: WRITE and DESCRIBE on transactional-id {transactional_id!r} "
        f"(init_transactions refused: TRANSACTIONAL_ID_AUTHORIZATION_FAILED). {HINT}"
    )


def _topic_gaps(admin: AdminClient, needed: Sequence[Acl], timeout_s: float, before_topics: bool) -> list[str]:
    uses: dict[str, list[Acl]] = defaultdict(list)  # READ/WRITE/DELETE ... of a topic, which must exist
    creates: dict[str, Acl] = {}
    for acl in needed:
        if acl.resource == "topic" and acl.operations == ("CREATE",):
            creates[acl.name] = acl
        elif acl.resource == "topic":
            uses[acl.name].append(acl)
    if not uses:
        return []
    futures = admin.describe_topics(
        TopicCollection(list(uses)), include_authorized_operations=True, request_timeout=timeout_s
    )
    gaps, absent = [], []
    for name, future in futures.items():
        try:
            granted = _operations(future.result(timeout=timeout_s).authorized_operations)
        except KafkaException as e:
            error = e.args[0]
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                absent.append(name)  # the principal may see it, it is not there (yet)
            elif error.code() in _DENIED:
                gaps += [_gap(acl, acl.operations, "none") for acl in uses[name]]
            else:
                log.debug("permission check of topic %r skipped: %s", name, error)
            continue
        gaps += _lacking(uses[name], granted)
    if before_topics:
        gaps += _create_gaps(admin, [creates[name] for name in absent if name in creates], timeout_s)
    return gaps


def _create_gaps(admin: AdminClient, acls: list[Acl], timeout_s: float) -> list[str]:
    """CREATE on topics that do not exist, asked with a validate-only request (nothing is created)."""
    if not acls:
        return []
    futures = admin.create_topics(
        [NewTopic(acl.name, 1) for acl in acls], validate_only=True, request_timeout=timeout_s
    )
    gaps = []
    for acl in acls:
        try:
            futures[acl.name].result(timeout=timeout_s)
        except KafkaException as e:
            if e.args[0].code() in _DENIED:
                gaps.append(_gap(acl, acl.operations, None))
            else:  # e.g. created meanwhile by another instance: the topic check that follows decides
                log.debug("permission check of creating topic %r skipped: %s", acl.name, e.args[0])
    return gaps


def _group_gaps(admin: AdminClient, groups: list[Acl], timeout_s: float) -> list[str]:
    if not groups:
        return []
    futures = admin.describe_consumer_groups(
        [acl.name for acl in groups], include_authorized_operations=True, request_timeout=timeout_s
    )
    gaps = []
    for acl in groups:
        try:
            granted = _operations(futures[acl.name].result(timeout=timeout_s).authorized_operations)
        except KafkaException as e:
            if e.args[0].code() in _DENIED:
                gaps.append(_gap(acl, acl.operations, "none"))
            else:
                log.debug("permission check of group %r skipped: %s", acl.name, e.args[0])
            continue
        gaps += _lacking([acl], granted)
    return gaps


def _operations(authorized: list[AclOperation] | None) -> set[str] | None:
    """The operation names the broker reported, or None when it reported none (a broker before KIP-430)."""
    return None if authorized is None else {op.name for op in authorized}


def _lacking(acls: list[Acl], granted: set[str] | None) -> list[str]:
    if granted is None:
        return []
    gaps = []
    for acl in acls:
        lacking = tuple(op for op in acl.operations if op not in granted)
        if lacking:
            gaps.append(_gap(acl, lacking, ", ".join(sorted(granted)) or "none"))
    return gaps


def _gap(acl: Acl, operations: tuple[str, ...], granted: str | None) -> str:
    """`WRITE on topic 'x-dlq' (dead letters; granted: DESCRIBE)`."""
    return f"{' and '.join(operations)} on {acl.resource} {acl.name!r} ({acl.why}" + (
        f"; granted: {granted})" if granted is not None else ")"
    )
