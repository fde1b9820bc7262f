"""The images of `make image`, built and run here with podman (deploy/image/): the service image under faults against
the local broker with the checker's verdict, and `snapshots compact` from the compaction image.

Skipped, with the reason, where no container engine can run (podman missing and not installable, or `podman run`
of the base image failing). A build that fails once the engine runs is a failure, not a skip.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from pipeline.loading import load_app
from pipeline.testing import faults, inputs
from pipeline.testing.faults import FaultRun
from pipeline.testing.harness import group_owners
from tests.faults.conftest import assert_exactly_once
from tests.image.containers import BUILD_TIMEOUT_S, COMPACTION_IMAGE, SERVICE_IMAGE, ContainerFleet, podman
from tests.support import eventually

pytestmark = [pytest.mark.image]

TOTALS = "pipeline.examples.running_totals:app"
PARTITIONS = 3
RECORDS = 4_000


@pytest.fixture
def container_fleets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ContainerFleet]]:
    """FaultRun starts ContainerFleets instead of process fleets; every container is removed afterwards."""
    fleets: list[ContainerFleet] = []

    def make(*args, **kwargs) -> ContainerFleet:
        fleet = ContainerFleet(*args, **kwargs)
        fleets.append(fleet)
        return fleet

    monkeypatch.setattr(faults, "Fleet", make)
    yield fleets
    for fleet in fleets:
        fleet.remove_all()


def _compaction(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return podman(
        "run", "--rm", "--network", "host", COMPACTION_IMAGE, "snapshots", *args, timeout_s=timeout_s, check=False
    )


def _owners_if_settled(bootstrap: str, group: str, members: set[str]) -> dict[str, list[int]] | None:
    """The group's owners when every input partition is owned, by `members` only; None while it rebalances."""
    try:
        owners = group_owners(bootstrap, group)
    except KafkaException:
        return None
    owned = sorted(p for partitions in owners.values() for p in partitions)
    return owners if set(owners) <= members and owned == list(range(PARTITIONS)) else None


@pytest.mark.timeout(BUILD_TIMEOUT_S + 900)
def test_service_image_under_faults_then_compaction_image(images, kafka_bootstrap, container_fleets, tmp_path: Path):
    run = FaultRun(load_app(TOTALS), TOTALS, kafka_bootstrap, PARTITIONS, tmp_path / "logs")
    try:
        run.feed(list(inputs.running_totals_records(RECORDS, partitions=PARTITIONS, seed=5)), seconds=25)
        fleet = run.start(2)
        time.sleep(2)
        faults.FAULTS["sigkill"].inject(fleet, random.Random(12))  # podman kill -s KILL a container, start another
        members = {i.name for i in fleet.alive}
        owners = eventually(lambda: _owners_if_settled(kafka_bootstrap, run.app_id, members), timeout_s=90)
        # The zombie: the container owning most partitions, frozen (podman pause) until the other one has taken
        # all of them over, i.e. past its session time-out; it wakes up with its transactions open.
        zombie = next(i for i in fleet.alive if i.name == max(owners, key=lambda name: len(owners[name])))
        zombie.pause()
        try:
            eventually(lambda: _owners_if_settled(kafka_bootstrap, run.app_id, members - {zombie.name}), timeout_s=90)
        finally:
            zombie.resume()
        outcome = run.finish(timeout_s=180)
    finally:
        run.abandon()
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == RECORDS
    assert len(container_fleets[0].instances) == 3, "a killed container must have been replaced"

    compact = _compaction(
        "compact", "--bootstrap-servers", kafka_bootstrap, "--app-id", run.app_id, "--master", "local[1]"
    )
    assert compact.returncode == 0, compact.stdout[-3000:] + compact.stderr[-6000:]
    show = _compaction("show", "--bootstrap-servers", kafka_bootstrap, "--app-id", run.app_id, timeout_s=300)
    assert show.returncode == 0, show.stderr[-3000:]
    manifests = [line for line in show.stdout.splitlines() if line.startswith(f"{run.app_id}-snapshots[")]
    assert len(manifests) == PARTITIONS, show.stdout
    assert all(not line.endswith(": 0 manifests") for line in manifests), show.stdout


def test_service_image_runs_as_non_root_with_the_pipeline_entrypoint(images):
    result = podman("run", "--rm", "--network", "host", "--entrypoint", "id", SERVICE_IMAGE, "-u")
    assert result.stdout.strip() == "10001"
    help_text = podman("run", "--rm", "--network", "host", SERVICE_IMAGE, "--help").stdout
    assert "pipeline run" in help_text
