"""Real servers for the tests: `KAFKA_BOOTSTRAP_SERVERS` if set, else testcontainers when a Docker engine answers,
else the project's own local broker (deploy/local/kafka.sh). One broker per test session; unique topics per test.
Every test that needs a server is marked `kafka` (tests/plugins/servers.py): `pytest -m "not kafka"` needs none."""

from __future__ import annotations

import gc
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.topics import partition_counts
from tests.support import docker_available, eventually

REPO = Path(__file__).resolve().parent.parent
KAFKA_SH = REPO / "deploy" / "local" / "kafka.sh"

pytest_plugins = [
    "tests.plugins.postgres",
    "tests.plugins.registry",
    "tests.plugins.spark",
    "tests.plugins.servers",
]


@pytest.fixture(autouse=True)
def garbage_collected_on_the_test_thread() -> Iterator[None]:
    """The cyclic garbage collector runs only here, between tests, on pytest's own thread. Left on, it ran wherever
    Python allocated, and once that was a librdkafka thread completing an admin future: it freed a client handle
    left in a reference cycle by an earlier test, librdkafka refuses to destroy a handle from its own thread, and
    the whole pytest process aborted ("Fatal Python error: Aborted", "Garbage-collecting", a CI run's integration
    lane). Reference counting still frees everything else at once; cycles wait for the end of their test. What
    survives a test's collection is frozen, so that the next one scans only what that test made."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def _kafka_sh(*args: str) -> str:
    """The script's stdout; when it fails, its stderr in the error (a CalledProcessError alone said only the exit
    code, and a broker that would not start left no reason in the test report)."""
    done = subprocess.run([str(KAFKA_SH), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"deploy/local/kafka.sh {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout.strip()


def _is_running(*mode: str) -> bool:
    return "running" in _kafka_sh(*mode, "status")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    if servers := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield servers
        return
    if docker_available():
        from tests.image.servers import build_images, kafka_server  # imports testcontainers only when it is used

        build_images()
        with kafka_server() as bootstrap:
            yield bootstrap
        return
    was_running = _is_running()
    _kafka_sh("start")
    yield _kafka_sh("bootstrap")
    if not was_running and os.environ.get("KEEP_KAFKA") != "1":
        _kafka_sh("stop")


@dataclass
class LocalCluster:
    """The 3-node KRaft cluster of deploy/local/kafka.sh --cluster, with its fault switches."""

    bootstrap: str

    def kill(self, node: int) -> None:
        _kafka_sh("--cluster", "kill", str(node))

    def restart(self, node: int) -> None:
        _kafka_sh("--cluster", "restart", str(node))

    def pause(self, node: int) -> None:
        _kafka_sh("--cluster", "pause", str(node))

    def resume(self, node: int) -> None:
        _kafka_sh("--cluster", "resume", str(node))


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    if os.environ.get("KAFKA_CLUSTER_BOOTSTRAP_SERVERS"):
        pytest.skip("fault switches need the local cluster script; an external cluster cannot be killed from here")
    was_running = _is_running("--cluster")
    _kafka_sh("--cluster", "start")
    cluster = LocalCluster(_kafka_sh("--cluster", "bootstrap"))
    # "Started" is not yet "can create a topic replicated 3 times": wait for the controller and all three brokers.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    eventually(lambda: _probe_topic(admin), 60, 0.5)
    eventually(lambda: _warm_coordinators(cluster.bootstrap), 120, 1)
    yield cluster
    if not was_running and os.environ.get("KEEP_KAFKA") != "1":
        _kafka_sh("--cluster", "stop")


@dataclass(frozen=True)
class SecureBroker:
    """The SASL_SSL broker of deploy/local/kafka.sh --secure: its address, CA and the users' passwords."""

    bootstrap: str
    ca_location: str
    passwords: dict[str, str]  # user -> password (admin is the super user)

    def client_config(self, user: str, password: str | None = None, ca_location: str | None = None) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": self.passwords[user] if password is None else password,
            "ssl.ca.location": ca_location or self.ca_location,
        }


@pytest.fixture(scope="session")
def kafka_secure() -> Iterator[SecureBroker]:
    was_running = _is_running("--secure")
    _kafka_sh("--secure", "start")
    values = dict(
        line.split("=", 1)
        for line in Path(_kafka_sh("--secure", "credentials")).read_text().splitlines()
        if line and not line.startswith("#")
    )
    passwords = {
        name[len("KAFKA_SECURE_") : -len("_PASSWORD")].lower(): value
        for name, value in values.items()
        if name.endswith("_PASSWORD") and name != "KAFKA_SECURE_KEYSTORE_PASSWORD"
    }
    yield SecureBroker(values["KAFKA_SECURE_BOOTSTRAP"], values["KAFKA_SECURE_CA"], passwords)
    if not was_running and os.environ.get("KEEP_KAFKA") != "1":
        _kafka_sh("--secure", "stop")


def _probe_topic(admin: AdminClient) -> bool:
    name = "cluster-ready-probe"
    try:
        admin.create_topics([NewTopic(name, 1, 3)], request_timeout=5)[name].result(10)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            return False
    return partition_counts(admin, 5, needed=[name]).get(name) == 1


def _warm_coordinators(bootstrap: str) -> bool:
    """A fresh cluster creates its transaction and group coordinators' topics (__transaction_state and
    __consumer_offsets, 50 partitions of 3 replicas each) for the first transactional producer and the first group:
    up to a minute on a loaded machine. In CI the first cluster test met that cold start: its fence took 20 s, ran into
    the test's first broker kill, and the process gave up. Done once here, every test starts with coordinators that
    answer."""
    probe = "cluster-ready-probe"
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": probe})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(probe, b"warm")
        producer.commit_transaction(30)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": probe, "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[TopicPartition(probe, 0, 1)], asynchronous=False)
        finally:
            consumer.close()
    except KafkaException:
        return False
    return True


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def new_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Creates a topic with a name unique to this test: new_topic("out", partitions=3)."""

    def create(label: str = "t", partitions: int = 1, replication: int = 1, admin: AdminClient | None = None) -> str:
        name = f"{request.node.name[:40]}-{label}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")
        futures = (admin or kafka_admin).create_topics([NewTopic(name, partitions, replication)])
        futures[name].result(timeout=30)
        # Created is not yet led: wait for every partition's leader so the test starts on a usable topic.
        eventually(lambda: partition_counts(admin or kafka_admin, 10, needed=[name]).get(name) == partitions, 30)
        return name

    return create


@pytest.fixture
def unique_id(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:30]}-{uuid.uuid4().hex[:8]}"
