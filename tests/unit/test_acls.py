"""deploy/SECURITY.md shows exactly the ACLs that pipeline/kafka/acls.py defines (the definition the security tests
grant and the runners check), so the document and the proof cannot drift apart; the names in that definition are
the names the runtime uses."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.core.deadletter import dead_letter_topic
from pipeline.kafka.acls import (
    Acl,
    Names,
    admin_properties,
    binding_filters,
    bindings,
    compaction_acls,
    kafka_acls_lines,
    markdown_table,
    pipeline_acls,
    postgres_acls,
)
from pipeline.kafka.liveness import liveness_topic
from pipeline.settings import ConfigError
from pipeline.sinks.kafka.transaction import transactional_id
from pipeline.state.changelog import changelog_topic
from pipeline.state.snapshot_format import snapshot_topic

SECURITY_MD = Path(__file__).resolve().parents[2] / "deploy" / "SECURITY.md"
EXAMPLE = Names("running-totals", "totals-input", "totals-output")
PG_EXAMPLE = Names("running-totals-pg", "totals-input", "")


def documented_definition() -> list[str]:
    """The lines SECURITY.md shows: the service's with the default FAILURE_DETECTION_MS (on), then the others'."""
    return (
        kafka_acls_lines("User:running-totals", pipeline_acls(EXAMPLE))
        + kafka_acls_lines("User:running-totals-compaction", compaction_acls(EXAMPLE))
        + kafka_acls_lines("User:running-totals-pg", postgres_acls(PG_EXAMPLE))
    )


def test_security_md_lists_exactly_the_defined_acl_commands() -> None:
    shown = [line for line in SECURITY_MD.read_text().splitlines() if re.match(r"^\$ACLS --add ", line)]
    assert shown == documented_definition()


def test_security_md_tables_are_the_definition() -> None:
    doc = SECURITY_MD.read_text()
    for acls in (pipeline_acls(EXAMPLE), compaction_acls(EXAMPLE), postgres_acls(PG_EXAMPLE), detection_only(EXAMPLE)):
        for row in markdown_table(acls):
            assert row in doc, row


def test_least_privilege_has_no_cluster_acl_and_no_wildcard() -> None:
    for acl in pipeline_acls(EXAMPLE) + compaction_acls(EXAMPLE) + postgres_acls(PG_EXAMPLE):
        assert acl.resource in ("topic", "group", "transactional-id")
        assert "*" not in acl.name and acl.name
    transactional = [a for a in pipeline_acls(EXAMPLE) if a.resource == "transactional-id"]
    assert [(a.name, a.prefixed) for a in transactional] == [("running-totals.", True)]


def test_the_names_are_the_runtimes() -> None:
    assert EXAMPLE.changelog == changelog_topic("running-totals")
    assert EXAMPLE.snapshots == snapshot_topic("running-totals")
    assert EXAMPLE.dead_letters == dead_letter_topic("running-totals")
    assert EXAMPLE.liveness == liveness_topic("running-totals")
    assert transactional_id("running-totals", "totals-input", 7).startswith(EXAMPLE.transactional_id_prefix)
    renamed = Names("a", "in", "out", changelog_topic="c", snapshot_topic="s", dead_letter_topic="d")
    assert (renamed.changelog, renamed.snapshots, renamed.dead_letters) == ("c", "s", "d")


def test_what_a_service_does_not_use_it_is_not_granted() -> None:
    stateless = {a.name for a in pipeline_acls(EXAMPLE, stateful=False, failure_detection=False)}
    assert stateless == {"totals-input", "totals-output", "running-totals-dlq", "running-totals", "running-totals."}
    detecting = {a.name for a in pipeline_acls(EXAMPLE, stateful=False)}  # FAILURE_DETECTION_MS's default: on
    assert detecting == stateless | {"running-totals-liveness"}
    assert not [a for a in pipeline_acls(EXAMPLE, exactly_once=False) if a.resource == "transactional-id"]
    assert not [a for a in pipeline_acls(EXAMPLE, create_internal_topics=False) if "CREATE" in a.operations]
    snapshots = [a for a in pipeline_acls(EXAMPLE, snapshot_on_shutdown=True) if a.name == EXAMPLE.snapshots]
    assert snapshots[0].operations == ("READ", "WRITE")
    assert not [a for a in compaction_acls(EXAMPLE, keep_history=True) if "DELETE" in a.operations]
    assert {a.resource for a in postgres_acls(PG_EXAMPLE)} == {"topic", "group"}


def test_keys_are_unique_and_bindings_are_one_per_operation() -> None:
    acls = pipeline_acls(EXAMPLE)
    assert len({a.key for a in acls}) == len(acls)
    assert len(bindings("User:x", acls)) == sum(len(a.operations) for a in acls)
    assert [(f.name, f.operation) for f in binding_filters("User:x", acls)] == [
        (b.name, b.operation) for b in bindings("User:x", acls)
    ]


# -- `pipeline acls` ---------------------------------------------------------------------------------------------------
def acls_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    for key in [k for k in os.environ if k.startswith("PIPELINE_")]:
        monkeypatch.delenv(key)
    code = cli.main(["acls", *args])
    return code, capsys.readouterr().out


def test_acls_prints_what_security_md_shows(capsys, monkeypatch) -> None:
    code, out = acls_command(capsys, monkeypatch, "pipeline.examples.running_totals:app")
    pg_code, pg_out = acls_command(capsys, monkeypatch, "pipeline.examples.running_totals_pg:app", "--sink", "postgres")

    assert (code, pg_code) == (0, 0)
    printed = [line for line in (out + pg_out).splitlines() if line.startswith("$ACLS --add ")]
    assert printed == documented_definition()
    assert out.splitlines()[0] == (
        'ACLS="kafka-acls.sh --bootstrap-server 127.0.0.1:9092 --command-config admin.properties"'
    )
    assert "# User:running-totals-compaction: snapshots compact --app-id running-totals" in out


def test_acls_follow_the_settings_pipeline_run_reads(capsys, monkeypatch, tmp_path: Path) -> None:
    config = tmp_path / "service.toml"
    config.write_text('app_id = "orders"\nchangelog_topic = "orders-state"\nsnapshot_on_shutdown = true\n')
    code, out = acls_command(
        capsys,
        monkeypatch,
        "pipeline.examples.running_totals:app",
        "--config",
        str(config),
        "--input-topic",
        "orders-in",
        "--principal",
        "User:svc",
        "--compaction-principal",
        "User:job",
        "--no-create-topics",
        "--keep-history",
    )

    assert code == 0
    expected = kafka_acls_lines(
        "User:svc",
        pipeline_acls(
            Names("orders", "orders-in", "totals-output", changelog_topic="orders-state"),
            create_internal_topics=False,
            snapshot_on_shutdown=True,
        ),
    ) + kafka_acls_lines(
        "User:job", compaction_acls(Names("orders", "", "", changelog_topic="orders-state"), keep_history=True)
    )
    assert [line for line in out.splitlines() if line.startswith("$ACLS")] == expected


def test_acls_list_the_heartbeat_topic_only_with_failure_detection(capsys, monkeypatch) -> None:
    """FAILURE_DETECTION_MS (on by default) adds READ, WRITE and CREATE on `<app id>-liveness`; the LeaveGroup of a
    silent peer and the fence of its per-process producer are covered by the group's READ and the transactional-id
    prefix, listed anyway. FAILURE_DETECTION_MS=0 leaves the heartbeat topic out."""
    code, detecting = acls_command(capsys, monkeypatch, "pipeline.examples.running_totals:app")
    monkeypatch.setenv("PIPELINE_FAILURE_DETECTION_MS", "0")
    plain_code = cli.main(["acls", "pipeline.examples.running_totals:app"])
    plain = capsys.readouterr().out

    assert (code, plain_code) == (0, 0)
    assert "liveness" not in plain
    added = [line for line in detecting.splitlines() if line not in plain.splitlines()]
    assert added == kafka_acls_lines("User:running-totals", detection_only(EXAMPLE))
    group = [a for a in pipeline_acls(EXAMPLE, failure_detection=True) if a.resource == "group"]
    assert [(a.name, a.operations) for a in group] == [("running-totals", ("READ",))]
    assert "LeaveGroup" in group[0].why


def detection_only(names: Names) -> list[Acl]:
    plain = pipeline_acls(names, failure_detection=False)
    return [a for a in pipeline_acls(names, failure_detection=True) if a.key not in {p.key for p in plain}]


def test_acls_of_a_stateless_app_have_no_compaction_job(capsys, monkeypatch) -> None:
    code, out = acls_command(capsys, monkeypatch, "pipeline.examples.copier:app")

    assert code == 0
    assert "compaction" not in out and "changelog" not in out
    assert "--operation Create --topic copier-dlq" in out


def test_a_wrong_app_path_for_acls_is_one_line(capsys, monkeypatch) -> None:
    assert cli.main(["acls", "no_such_module:app"]) == 2
    assert capsys.readouterr().err.startswith("pipeline acls: 'no_such_module:app': no module named")


def test_command_config_reads_kafka_acls_properties(tmp_path: Path) -> None:
    properties = tmp_path / "admin.properties"
    properties.write_text(
        "# the file kafka-acls.sh --command-config takes\n"
        "security.protocol=SASL_SSL\nsasl.mechanism = SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
        'password="s3cr=t";\n'
        "ssl.truststore.type=PEM\nssl.truststore.location=/etc/kafka/ca.pem\n"
    )

    assert admin_properties(properties) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": "s3cr=t",
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }
    with pytest.raises(ConfigError, match=r"--command-config .*missing\.properties: No such file"):
        admin_properties(tmp_path / "missing.properties")
    (tmp_path / "bad.properties").write_text("security.protocol SASL_SSL\n")
    with pytest.raises(ConfigError, match="expected key=value"):
        admin_properties(tmp_path / "bad.properties")
