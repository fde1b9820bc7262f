"""The least-privilege ACLs of a service and of its compaction job, defined once.

deploy/SECURITY.md shows them (a test checks that it shows exactly these), `pipeline acls` prints them as
`kafka-acls.sh` lines or applies them with the admin client, the runners check them at start-up
(pipeline/kafka/permissions.py), and the security tests grant exactly these and then take each away in turn to prove
that every one is needed and that together they are enough.

No cluster-level ACL appears: since Kafka 3.0 IDEMPOTENT_WRITE is implied by WRITE on a topic, and a transactional
producer is authorized by its transactional id. READ and WRITE on a topic imply DESCRIBE. The restore consumer's
group (`<app_id>.restore`) and the standby follower's (`<app_id>.standby`) need no ACL: they assign partitions
themselves and never ask their coordinator anything. The standby placement's DescribeGroups on the App's group is
covered by READ on it (READ implies DESCRIBE).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from pipeline.settings import ConfigError, Settings

SNAPSHOT_PUBLISHER = "snapshot-publisher"  # <app_id>.snapshot-publisher: the compaction job's transactional id


@dataclass(frozen=True)
class Acl:
    """ALLOW `operations` on one resource, and why."""

    resource: str  # "topic", "group" or "transactional-id"
    name: str
    operations: tuple[str, ...]  # "READ", "WRITE", "CREATE", "DESCRIBE", "DELETE"
    why: str
    prefixed: bool = False

    @property
    def key(self) -> str:
        """Stable name of this ACL, e.g. `topic:totals-input:READ`, for tests and error messages."""
        return f"{self.resource}:{self.name}{'*' if self.prefixed else ''}:{'+'.join(self.operations)}"


@dataclass(frozen=True)
class Names:
    """The names a service's ACLs are about. The internal topics default to the runner's names for the app id
    (pipeline/state/changelog.py, snapshot_format.py, deadletter.py; a unit test keeps them equal), unless the
    service overrides them (PIPELINE_CHANGELOG_TOPIC, PIPELINE_SNAPSHOT_TOPIC, PIPELINE_DEAD_LETTER_TOPIC)."""

    app_id: str
    input_topic: str
    output_topic: str
    changelog_topic: str = ""
    snapshot_topic: str = ""
    dead_letter_topic: str = ""
    co_partitioned: tuple[str, ...] = ()  # the other topics a task reads partition p of: inputs, then tables
    global_tables: tuple[str, ...] = ()  # read whole by every instance, without a group

    @property
    def changelog(self) -> str:
        return self.changelog_topic or f"{self.app_id}-changelog"

    @property
    def snapshots(self) -> str:
        return self.snapshot_topic or f"{self.app_id}-snapshots"

    @property
    def dead_letters(self) -> str:
        return self.dead_letter_topic or f"{self.app_id}-dlq"

    @property
    def liveness(self) -> str:
        """FAILURE_DETECTION_MS's heartbeat topic (pipeline/kafka/liveness.py)."""
        return f"{self.app_id}-liveness"

    @property
    def transactional_id_prefix(self) -> str:
        """Every transactional id of the service starts with it: `<app_id>.<input topic>.<partition>`
        (PRODUCERS=per_partition) or `<app_id>.<input topic>.process-<instance id or random>` (per_process)."""
        return f"{self.app_id}."


def pipeline_acls(
    n: Names,
    *,
    stateful: bool = True,
    exactly_once: bool = True,
    create_internal_topics: bool = True,
    snapshot_on_shutdown: bool = False,
    failure_detection: bool = True,
) -> list[Acl]:
    """What `pipeline run` with the Kafka sink needs, and nothing more. A stateless app has no changelog and no
    snapshots; at_least_once has no transactional producers. `failure_detection` (FAILURE_DETECTION_MS > 0, the
    default) adds the heartbeat topic; what its removal of a silent peer needs is already here: LeaveGroup is
    authorized by READ on the group, and the fence of the peer's per-process producer by the transactional-id prefix
    that covers it."""
    acls = [
        Acl("topic", n.input_topic, ("READ",), "the group consumer"),
        *(Acl("topic", t, ("READ",), "an input or table beside the first input") for t in n.co_partitioned),
        *(Acl("topic", t, ("READ",), "a global table, read whole") for t in n.global_tables),
        Acl("topic", n.output_topic, ("WRITE",), "outputs"),
    ]
    if stateful:
        acls += [
            Acl("topic", n.changelog, ("READ", "WRITE"), "state changes and checkpoints; read back by restores"),
            Acl(
                "topic",
                n.snapshots,
                ("READ", "WRITE") if snapshot_on_shutdown else ("READ",),
                "full snapshots read by restores" + (" and written on shutdown" if snapshot_on_shutdown else ""),
            ),
        ]
    if failure_detection:
        acls.append(Acl("topic", n.liveness, ("READ", "WRITE"), "FAILURE_DETECTION_MS: heartbeats, own and peers'"))
    group_why = "membership, committed offsets, send_offsets_to_transaction"
    acls += [
        Acl("topic", n.dead_letters, ("WRITE",), "dead letters"),
        Acl("group", n.app_id, ("READ",), group_why + ("; LeaveGroup of a silent peer" if failure_detection else "")),
    ]
    if exactly_once:
        acls.append(
            Acl(
                "transactional-id",
                n.transactional_id_prefix,
                ("WRITE", "DESCRIBE"),
                "the transactional producers, named app_id.input_topic.<partition> (PRODUCERS=per_partition) "
                "or app_id.input_topic.process-<id> (per_process)"
                + ("; a silent peer's per_process producer, fenced" if failure_detection else ""),
                prefixed=True,
            )
        )
    if create_internal_topics:
        internal: tuple[str, ...] = (n.changelog, n.snapshots, n.dead_letters) if stateful else (n.dead_letters,)
        internal += (n.liveness,) if failure_detection else ()
        acls += [
            Acl("topic", t, ("CREATE",), "created at start-up if missing (pre-create them and drop this)")
            for t in internal
        ]
    return acls


def service_acls(n: Names, settings: Settings, *, stateful: bool, create_internal_topics: bool = True) -> list[Acl]:
    """What `pipeline run` needs with these settings (sink, guarantee, snapshots on shutdown)."""
    if settings.sink == "postgres":
        return postgres_acls(n)
    return pipeline_acls(
        n,
        stateful=stateful,
        exactly_once=settings.exactly_once,
        create_internal_topics=create_internal_topics,
        snapshot_on_shutdown=settings.snapshot_on_shutdown,
        failure_detection=settings.failure_detection_ms > 0,
    )


def postgres_acls(n: Names) -> list[Acl]:
    """What `pipeline run` with the PostgreSQL sink needs: results, state, dead letters and the offsets that count
    live in the database, so Kafka only serves the input. The group's offsets are still committed (for lag
    monitoring), which OffsetCommit authorizes by READ on the group and on the topic."""
    return [
        Acl("topic", n.input_topic, ("READ",), "the group consumer"),
        Acl("group", n.app_id, ("READ",), "membership; offsets committed for lag monitoring only"),
    ]


def compaction_acls(n: Names, keep_history: bool = False) -> list[Acl]:
    """What `snapshots compact` needs: read both internal topics, publish snapshots, delete below old generations.
    Neither its driver's consumer nor Spark's Kafka source joins or asks a group: no group ACL."""
    acls = [
        Acl("topic", n.changelog, ("READ",), "the changelog since the base snapshot (Spark's Kafka source)"),
        Acl("topic", n.snapshots, ("READ", "WRITE"), "base snapshots in, new chunks and manifests out"),
        Acl(
            "transactional-id",
            f"{n.app_id}.{SNAPSHOT_PUBLISHER}",
            ("WRITE", "DESCRIBE"),
            "manifests published in one transaction, fencing a concurrent run",
        ),
    ]
    if not keep_history:
        acls += [
            Acl("topic", t, ("DELETE",), "retention: delete_records below the previous generation")
            for t in (n.changelog, n.snapshots)
        ]
    return acls


# -- rendering and applying ------------------------------------------------------------------------------------------
_RESOURCE_FLAG = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}
_RESOURCE_TYPE = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
}


def kafka_acls_lines(principal: str, acls: Iterable[Acl], command: str = "$ACLS") -> list[str]:
    """`kafka-acls.sh --add` lines, one per ACL (`command` stands for the tool and its connection options)."""
    lines = []
    for acl in acls:
        operations = " ".join(f"--operation {op.capitalize()}" for op in acl.operations)
        pattern = " --resource-pattern-type prefixed" if acl.prefixed else ""
        lines.append(
            f"{command} --add --allow-principal {principal} {operations} "
            f"{_RESOURCE_FLAG[acl.resource]} {acl.name}{pattern}"
        )
    return lines


def markdown_table(acls: Iterable[Acl]) -> list[str]:
    rows = ["| resource | operations | why |", "|---|---|---|"]
    for acl in acls:
        name = f"{acl.resource} `{acl.name}`" + (" (prefixed)" if acl.prefixed else "")
        rows.append(f"| {name} | {', '.join(acl.operations)} | {acl.why} |")
    return rows


def bindings(principal: str, acls: Iterable[Acl]) -> list[AclBinding]:
    """The admin client's form: one binding per (resource, operation)."""
    return [
        AclBinding(
            _RESOURCE_TYPE[acl.resource],
            acl.name,
            ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation[op],
            AclPermissionType.ALLOW,
        )
        for acl in acls
        for op in acl.operations
    ]


def binding_filters(principal: str, acls: Iterable[Acl]) -> list[AclBindingFilter]:
    """Filters matching exactly `bindings(principal, acls)`, for delete_acls."""
    return [
        AclBindingFilter(
            b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type
        )
        for b in bindings(principal, acls)
    ]


# -- the admin's client settings for --apply ---------------------------------------------------------------------------
_JAAS_VALUE = r'{}\s*=\s*"([^"]*)"'


def read_properties(path: Path, option: str) -> dict[str, str]:
    """The `key=value` lines of a Java client properties file (`#` and `!` comment lines); errors name `option`."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{option} {path}: {e.strerror}") from None
    properties: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, sep, value = line.partition("=")
            if not sep:
                raise ConfigError(f"{option} {path}: expected key=value, got a line without '='")
            properties[key.strip()] = value.strip()
    return properties


def admin_properties(path: Path) -> dict[str, str]:
    """librdkafka properties from a `kafka-acls.sh --command-config` file: `key=value` lines; a Java
    `sasl.jaas.config` (PLAIN or SCRAM login module) becomes sasl.username / sasl.password, and a PEM truststore
    becomes ssl.ca.location. Other Java-only properties are left for librdkafka to refuse by name."""
    properties = read_properties(path, "--command-config")
    if jaas := properties.pop("sasl.jaas.config", None):
        for key in ("username", "password"):
            if found := re.search(_JAAS_VALUE.format(key), jaas):
                properties[f"sasl.{key}"] = found.group(1)
    if properties.pop("ssl.truststore.type", "").upper() == "PEM" and "ssl.truststore.location" in properties:
        properties["ssl.ca.location"] = properties.pop("ssl.truststore.location")
    return properties
