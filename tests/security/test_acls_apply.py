"""`pipeline acls --apply` grants exactly the definition on the secured broker, with the admin's settings read from
a kafka-acls.sh properties file; a principal that may not alter ACLs is told so, binding by binding."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from pipeline.kafka.acls import Names, binding_filters, bindings, compaction_acls, pipeline_acls
from tests.security.conftest import COMPACTION, PIPELINE, REQUEST_S, TOTALS

pytestmark = pytest.mark.secure


def command_config(path: Path, kafka_secure, user: str) -> Path:
    """The properties file kafka-acls.sh would take (Java names): the password stays out of the command line."""
    path.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{kafka_secure.passwords[user]}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={kafka_secure.ca_location}\n"
    )
    return path


def pipeline_acls_command(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "acls", TOTALS, *args], env=env, capture_output=True, text=True, timeout=60
    )


def granted_to(admin: AdminClient, principal: str, app_id: str) -> set[tuple]:
    everything = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ANY
    )
    found = admin.describe_acls(everything, request_timeout=REQUEST_S).result(REQUEST_S)
    return {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in found if b.name.startswith(app_id)}


def as_set(principal: str, acls: list) -> set[tuple]:
    return {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in bindings(principal, acls)}


def test_apply_grants_exactly_the_definition(kafka_secure, tmp_path: Path) -> None:
    app_id = f"apply-{uuid.uuid4().hex[:8]}"
    names = Names(app_id, f"{app_id}-in", f"{app_id}-out")
    expected = {
        PIPELINE: as_set(PIPELINE, pipeline_acls(names)),
        COMPACTION: as_set(COMPACTION, compaction_acls(names)),
    }
    admin = AdminClient(kafka_secure.client_config("admin"))
    try:
        result = pipeline_acls_command(
            "--app-id",
            app_id,
            "--input-topic",
            names.input_topic,
            "--output-topic",
            names.output_topic,
            "--principal",
            PIPELINE,
            "--compaction-principal",
            COMPACTION,
            "--apply",
            "--bootstrap-servers",
            kafka_secure.bootstrap,
            "--command-config",
            str(command_config(tmp_path / "admin.properties", kafka_secure, "admin")),
        )

        assert result.returncode == 0, result.stderr
        assert result.stdout.count("granted ") == sum(len(v) for v in expected.values())
        assert "granted WRITE on transactional_id '" + app_id + ".' (prefixed) to User:pipeline" in result.stdout
        # The broker's authorizer takes the controller's new ACLs a moment after CreateAcls answered (KRaft): a
        # describe at once found none in a run.
        deadline = time.monotonic() + 10
        while (granted := {p: granted_to(admin, p, app_id) for p in expected}) != expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert granted == expected
    finally:
        for principal, acls in ((PIPELINE, pipeline_acls(names)), (COMPACTION, compaction_acls(names))):
            for future in admin.delete_acls(binding_filters(principal, acls)).values():
                future.result(REQUEST_S)


def test_apply_without_the_right_to_alter_acls_says_so(kafka_secure, tmp_path: Path) -> None:
    app_id = f"apply-{uuid.uuid4().hex[:8]}"
    result = pipeline_acls_command(
        "--app-id",
        app_id,
        "--apply",
        "--bootstrap-servers",
        kafka_secure.bootstrap,
        "--command-config",
        str(command_config(tmp_path / "pipeline.properties", kafka_secure, "pipeline")),
    )

    assert result.returncode == 1
    assert f"pipeline acls: cannot grant READ on topic 'totals-input' to User:{app_id}: " in result.stderr
    assert "CLUSTER_AUTHORIZATION_FAILED" in result.stderr
    assert kafka_secure.passwords["pipeline"] not in result.stdout + result.stderr
