"""Deployment files: every YAML under deploy/ and docker-compose.yml parses, and the invariants they rely on hold.

Offline: no Docker engine, no Kubernetes. The settings they pass are loaded with pipeline.settings (an unknown or
invalid PIPELINE_* variable would stop the process at start-up), and the metrics that alerts and the dashboard use
must exist in pipeline.metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.metrics import Metrics
from pipeline.redaction import SECRET_WORDS
from pipeline.settings import Settings, load

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
COMPOSE = REPO / "docker-compose.yml"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), COMPOSE])
# Broker settings that name addresses or directories: different on loopback and in a container by design.
ADDRESS_KEYS = {"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs"}


def docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_objects() -> dict[str, dict]:
    """kind -> object, over the resources kustomization.yaml lists."""
    kustomization = docs(K8S / "kustomization.yaml")[0]
    objects: dict[str, dict] = {}
    for resource in kustomization["resources"]:
        for obj in docs(K8S / resource):
            assert obj["kind"] not in objects, f"two {obj['kind']} objects: the tests below assume one of each"
            objects[obj["kind"]] = obj
    return objects


def setting(env: dict[str, str], name: str) -> int:
    """An integer setting as the process would see it: the env value, else the default of pipeline/settings.py."""
    return int(env.get(f"PIPELINE_{name}", getattr(Settings(), name.lower())))


def commit_path_ms(env: dict[str, str]) -> int:
    """Longest commit path on SIGTERM: the open work (one commit interval), retries of a commit with an unknown outcome
    up to the transaction time-out, the last attempt's request time-out, then abort-or-flush (one more)."""
    return (
        setting(env, "COMMIT_INTERVAL_MS")
        + setting(env, "TRANSACTION_TIMEOUT_MS")
        + 2 * setting(env, "REQUEST_TIMEOUT_MS")
    )


def exported_metric_names() -> set[str]:
    exposition = Metrics().exposition().decode()
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_yaml_parses(path: Path) -> None:
    assert docs(path), f"{path} holds no YAML document"


def test_kustomization_resources_exist() -> None:
    kustomization = docs(K8S / "kustomization.yaml")[0]
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    assert {"ConfigMap", "StatefulSet", "Service", "PodDisruptionBudget"} <= set(k8s_objects())


def test_statefulset_probes_identity_and_grace_period() -> None:
    objects = k8s_objects()
    config = objects["ConfigMap"]["data"]
    sts = objects["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    port = int(config["PIPELINE_METRICS_PORT"])

    assert sts["spec"]["serviceName"] == objects["Service"]["metadata"]["name"]
    assert pod["terminationGracePeriodSeconds"] * 1000 > commit_path_ms(config)
    assert env["PIPELINE_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["envFrom"] == [{"configMapRef": {"name": objects["ConfigMap"]["metadata"]["name"]}}]
    # Kubernetes' service links would inject PIPELINE_* variables for a Service named pipeline*.
    assert pod["enableServiceLinks"] is False

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == port
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "metrics"}
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port) and annotations["prometheus.io/path"] == "/metrics"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]


def test_labels_and_selectors_agree() -> None:
    objects = k8s_objects()
    pod_labels = objects["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    for selector in (
        objects["StatefulSet"]["spec"]["selector"]["matchLabels"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        objects["Service"]["spec"]["selector"],
    ):
        assert selector.items() <= pod_labels.items()


def test_configmap_is_a_valid_configuration_without_secrets() -> None:
    objects = k8s_objects()
    config = objects["ConfigMap"]["data"]
    (container,) = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    settings = load(env={**config, "PIPELINE_GROUP_INSTANCE_ID": "running-totals-0"})  # raises on a bad setting
    assert settings.exactly_once
    # several pods: a dead one's partitions are taken over fast (issue 33), onto a warm copy
    assert objects["StatefulSet"]["spec"]["replicas"] >= 2
    assert settings.failure_detection_ms > 0 and settings.standby_replicas >= 1
    assert "sasl.password" not in settings.kafka
    secret_like = [k for k in config if any(w in k.lower() for w in SECRET_WORDS)]
    assert not secret_like, f"secrets belong in a Secret, not the ConfigMap: {secret_like}"
    for entry in container["env"]:
        if any(w in entry["name"].lower() for w in SECRET_WORDS):
            assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], entry["name"]


def compose() -> dict:
    return docs(COMPOSE)[0]


def kafka_sh_single_node() -> dict[str, str]:
    """deploy/local/kafka.sh's server.properties for the single node (node 1, replication 1, min ISR 1)."""
    script = (DEPLOY / "local" / "kafka.sh").read_text()
    heredoc = re.search(r'server\.properties" <<EOF\n(.*?)\nEOF\n', script, re.DOTALL)
    assert heredoc, "write_config's heredoc not found in deploy/local/kafka.sh"
    # The listeners come from listener_config (the plaintext branch: --secure has its own, in kafka-secure.sh).
    listeners = re.search(r"listener_config\(\) \{.*?cat <<EOF\n(.*?)\nEOF\n", script, re.DOTALL)
    assert listeners, "listener_config's heredoc not found in deploy/local/kafka.sh"
    text = heredoc.group(1).replace('$(listener_config "$n")', listeners.group(1))
    values = {"$n": "1", "$REPLICATION": "1", "$MIN_ISR": "1"}
    properties = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if key in ADDRESS_KEYS:
            continue
        properties[key] = values.get(value, value)
    assert not [v for v in properties.values() if "$" in v], properties
    return properties


def test_compose_kafka_matches_the_local_single_node() -> None:
    environment = compose()["services"]["kafka"]["environment"]
    compose_properties = {
        name.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
        for name, value in environment.items()
        if name.startswith("KAFKA_")
    }
    compose_properties = {k: v for k, v in compose_properties.items() if k not in ADDRESS_KEYS}
    local = kafka_sh_single_node()
    assert len(local) > 15
    assert compose_properties == local


def test_compose_pipelines() -> None:
    services = compose()["services"]
    instances = {name: s for name, s in services.items() if name.startswith("pipeline-")}
    assert len(instances) == 2
    ids, ports = set(), set()
    for name, service in instances.items():
        env = {k: str(v) for k, v in service["environment"].items()}
        settings = load(env=env)  # raises on a bad setting
        ids.add(settings.group_instance_id)
        ports.add(settings.metrics_port)
        # two instances: a dead one's partitions are taken over fast (issue 33), onto a warm copy
        assert settings.failure_detection_ms > 0 and settings.standby_replicas == 1, name
        assert service["build"] == "." and service["command"] == ["run", "pipeline.examples.running_totals:app"]
        assert service["depends_on"]["kafka"] == {"condition": "service_healthy"}
        assert service["depends_on"]["topics"] == {"condition": "service_completed_successfully"}
        assert f"localhost:{settings.metrics_port}/ready" in " ".join(service["healthcheck"]["test"]), name
        grace_s = int(service["stop_grace_period"].removesuffix("s"))
        assert grace_s * 1000 > commit_path_ms(env), name
    # Distinct: they share the kafka container's network namespace and one group.
    assert len(ids) == 2 and "" not in ids
    assert len(ports) == 2 and 0 not in ports
    assert "healthcheck" in services["kafka"]
    assert services["topics"]["command"][:2] == ["topics", "create"]
    assert services["compaction"]["profiles"] == ["compaction"]
    assert services["compaction"]["command"][:2] == ["snapshots", "compact"]


def test_compose_schema_registry_matches_the_local_one() -> None:
    """The same Apicurio version as deploy/local/registry.sh builds, on its port (loopback only), with its rule."""
    service = compose()["services"]["schema-registry"]
    lines = (DEPLOY / "versions.env").read_text().splitlines()
    versions = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    script = (DEPLOY / "local" / "registry.sh").read_text()
    port = re.search(r'PORT="\$\{REGISTRY_PORT:-(\d+)\}"', script)
    rule = re.search(r'COMPATIBILITY="\$\{REGISTRY_COMPATIBILITY:-(\w+)\}"', script)
    assert port and rule, "REGISTRY_PORT / REGISTRY_COMPATIBILITY defaults not found in deploy/local/registry.sh"
    image, tag = service["image"].split(":")
    assert image == "apicurio/apicurio-registry-mem" and tag == versions["APICURIO_REGISTRY_VERSION"]
    assert service["ports"] == [f"127.0.0.1:{port.group(1)}:8080"]
    assert service["environment"]["REGISTRY_RULES_GLOBAL_COMPATIBILITY"] == rule.group(1)
    assert "/apis/ccompat/v7/" in " ".join(service["healthcheck"]["test"])


def promql_metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bpipeline_[a-z_]+\b", text))


def test_alerts_and_dashboard_use_exported_metrics() -> None:
    exported = exported_metric_names()
    rules = docs(PROMETHEUS / "alerts.yaml")[0]
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    dashboard = json.loads((PROMETHEUS / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = promql_metric_names(" ".join([*alerts.values(), *queries]))
    assert used and used <= exported, used - exported
    for metric in (
        "pipeline_consumer_lag",
        "pipeline_transactions_total",
        "pipeline_fenced_partitions_total",
        "pipeline_dead_letters_total",
        "pipeline_restore_duration_seconds",
        "pipeline_ready",
        "pipeline_stalled_partitions",
        "pipeline_unowned_partitions",
    ):
        assert metric in promql_metric_names(" ".join(alerts.values())), metric
    assert 'pipeline_transactions_total{outcome="aborted"}' in " ".join(alerts.values())


def test_every_phony_name_of_the_makefile_is_a_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    [phony] = re.findall(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    assert set(phony.split()) - targets == set()


def test_the_state_dir_is_a_volume_of_its_own_per_instance() -> None:
    """STATE_STORE=disk: one process per STATE_DIR, and a restarted instance finds its own (issue 32)."""
    spec = k8s_objects()["StatefulSet"]["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    state_dir = next(e["value"] for e in container["env"] if e["name"] == "PIPELINE_STATE_DIR")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == state_dir)
    assert mount["name"] in {t["metadata"]["name"] for t in spec["volumeClaimTemplates"]}
    services = compose()["services"]
    volumes = set()
    for name in ("pipeline-1", "pipeline-2"):
        state_dir = services[name]["environment"]["PIPELINE_STATE_DIR"]
        (volume,) = [v.split(":")[0] for v in services[name]["volumes"] if v.endswith(":" + state_dir)]
        volumes.add(volume)
    assert len(volumes) == 2 and volumes <= set(compose()["volumes"])
