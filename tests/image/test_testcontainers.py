"""testcontainers without Docker and without a registry: Kafka and PostgreSQL from the images deploy/image/servers.sh
builds here, started through podman's Docker-compatible API (`podman system service`), with exactly-once runs of both
sinks against them under SIGKILL and the checker's verdict.

The container tests are skipped, with the reason, only where no container engine can run (as the other image tests);
once podman runs, an image that does not build or a container that does not come up fails them.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pipeline.loading import load_app
from pipeline.testing import faults, inputs
from pipeline.testing.faults import FaultRun
from tests.faults.conftest import assert_exactly_once
from tests.image.containers import podman
from tests.image.servers import (
    BUILD_TIMEOUT_S,
    KAFKA_IMAGE,
    OWNER_LABEL,
    POSTGRES_IMAGE,
    REPO,
    kafka_server,
    owner,
    postgres_server,
)
from tests.unit.test_deploy_files import kafka_sh_single_node

TOTALS = "pipeline.examples.running_totals:app"
TOTALS_PG = "pipeline.examples.running_totals_pg:app"
PARTITIONS = 3
RECORDS = 6_000
OWN_LISTENER_KEYS = {"inter.broker.listener.name", "listener.security.protocol.map"}
# The first test to ask for a server pays for the images (cold: minutes) and the container's start.
SETUP_TIMEOUT_S = BUILD_TIMEOUT_S + 300
# A deprecated testcontainers module or argument is an error here, not a warning that scrolls by.
pytestmark = [pytest.mark.filterwarnings("error:testcontainers:DeprecationWarning")]


@pytest.fixture(scope="module")
def kafka(podman_api: str) -> Iterator[str]:
    with kafka_server(podman_api) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="module")
def postgres(podman_api: str) -> Iterator[str]:
    with postgres_server(podman_api) as dsn:
        yield dsn


def our_containers() -> list[str]:
    """This test process's containers, as "ID IMAGE PORTS" lines."""
    mine = f"label={OWNER_LABEL}={owner()}"
    return podman("ps", "--all", "--filter", mine, "--format", "{{.ID}} {{.Image}} {{.Ports}}").stdout.splitlines()


def served_from(image: str, address: str) -> str:
    """The id of the container of `image` that this test process started and whose port `address` reaches."""
    port = re.search(r":(\d+)(/|$)", address).group(1)
    found = [line.split()[0] for line in our_containers() if f" {image} " in line and f":{port}->" in line]
    assert len(found) == 1, f"no container of {image} of ours publishes port {port}: {our_containers()}"
    return found[0]


def container_env(container: str) -> dict[str, str]:
    listed = json.loads(podman("inspect", "--format", "{{json .Config.Env}}", container).stdout)
    return dict(entry.split("=", 1) for entry in listed)


def run_with_a_sigkill(run: FaultRun, seed: int) -> faults.Outcome:
    """Paced input, two instances, one SIGKILLed mid-stream and replaced, then the checker."""
    try:
        run.feed(list(inputs.running_totals_records(RECORDS, partitions=PARTITIONS, seed=seed)), seconds=10)
        run.start(2)
        time.sleep(3)
        faults.FAULTS["sigkill"].inject(run.fleet, random.Random(seed))
        outcome = run.finish(timeout_s=180)
        assert len(run.fleet.instances) == 3, "the SIGKILLed instance must have been replaced"
        return outcome
    finally:
        run.abandon()


def broker_image_properties() -> dict[str, str]:
    """deploy/image/kafka/broker.properties, and what start.sh adds that is not an address."""
    text = (REPO / "deploy" / "image" / "kafka" / "broker.properties").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {**dict(line.split("=", 1) for line in lines), "controller.listener.names": "CONTROLLER"}


def test_the_broker_image_has_the_settings_of_the_local_broker():
    """The containerised broker behaves as deploy/local/kafka.sh's single node; only the listeners differ (its own
    connections need one inside the container)."""
    local = {k: v for k, v in kafka_sh_single_node().items() if k not in OWN_LISTENER_KEYS}
    assert broker_image_properties() == local


def test_the_server_helpers_import_no_deprecated_testcontainers_module():
    # A fresh interpreter: the module's imports run again, with testcontainers' deprecation warnings as errors.
    done = subprocess.run(
        [sys.executable, "-W", "error:testcontainers:DeprecationWarning", "-c", "import tests.image.servers"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.image
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_kafka_sink_exactly_once_under_sigkill_on_a_containerised_broker(kafka: str, tmp_path: Path):
    container = served_from(KAFKA_IMAGE, kafka)
    admin = AdminClient({"bootstrap.servers": kafka})
    # The broker the clients end up at (the advertised address) is that container's.
    assert admin.describe_cluster().result(30).cluster_id == container_env(container)["KAFKA_CLUSTER_ID"]
    resource = ConfigResource(ResourceType.BROKER, "1")
    running = {name: entry.value for name, entry in admin.describe_configs([resource])[resource].result(30).items()}
    expected = broker_image_properties()
    assert {name: running[name] for name in expected} == expected
    outcome = run_with_a_sigkill(FaultRun(load_app(TOTALS), TOTALS, kafka, PARTITIONS, tmp_path / "logs"), seed=21)
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == RECORDS


@pytest.mark.image
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_postgres_round_trip_in_a_container(postgres: str):
    served_from(POSTGRES_IMAGE, postgres)
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE round_trip (k text PRIMARY KEY, v bigint)")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO round_trip VALUES ('kept', 1)")
            with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
                conn.execute("INSERT INTO round_trip VALUES ('dropped', 2)")
                conn.execute("INSERT INTO round_trip VALUES ('kept', 3)")
            with psycopg.connect(postgres) as other:
                assert other.execute("SELECT k, v FROM round_trip").fetchall() == [("kept", 1)]
        finally:
            conn.execute("DROP TABLE round_trip")


@pytest.mark.image
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_postgres_sink_exactly_once_under_sigkill_with_both_servers_in_containers(
    kafka: str, postgres: str, tmp_path: Path
):
    app = load_app(TOTALS_PG)
    run = FaultRun(app, TOTALS_PG, kafka, PARTITIONS, tmp_path / "logs", postgres_dsn=postgres)
    outcome = run_with_a_sigkill(run, seed=22)
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == RECORDS


@pytest.mark.image
@pytest.mark.timeout(SETUP_TIMEOUT_S)
def test_a_servers_container_is_removed_after_its_block_and_a_killed_runs_are_swept(podman_api: str):
    """Without Ryuk: the block removes its container; one left by a test process that died is swept by the next."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = podman("create", "--label", f"{OWNER_LABEL}={socket.gethostname()}:{dead.pid}", POSTGRES_IMAGE)
    stale_id = stale.stdout.strip()
    before = set(our_containers())
    try:
        with postgres_server(podman_api) as dsn:
            started = set(our_containers()) - before
            assert len(started) == 1, started
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        assert not set(our_containers()) & started, "the server's container outlived its block"
        left = podman("ps", "--all", "--quiet", "--no-trunc", "--filter", f"id={stale_id}").stdout
        assert not left.strip(), "the dead test process's container was not swept"
    finally:
        podman("rm", "--force", "--ignore", stale_id, check=False)
