"""Kafka and PostgreSQL for the tests through testcontainers, from the images deploy/image/servers.sh builds here on
the project's base image (no registry), on any Docker-compatible API: Docker's, or podman's (`podman_service`).

`kafka_server()` and `postgres_server()` are what tests/conftest.py and tests/plugins/postgres.py use when a
Docker-compatible API answers; tests/image/test_testcontainers.py runs them against a podman API it starts itself.
Ryuk, testcontainers' reaper, is an image from a registry: it is disabled, and each server's container is removed
when its block ends; containers left by a test process that was killed are removed by the next one (`_sweep`).
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import docker
import psycopg
from confluent_kafka.admin import AdminClient
from docker.errors import DockerException, ImageNotFound
from testcontainers.community.postgres import PostgresContainer
from testcontainers.core.config import ConnectionMode, testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.docker_client import DockerClient, get_docker_host, is_podman
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

REPO = Path(__file__).resolve().parents[2]
SERVERS_SH = REPO / "deploy" / "image" / "servers.sh"
BUILD_TIMEOUT_S = 900  # cold: Debian's JRE and PostgreSQL into two images (vfs copies each layer)
START_TIMEOUT_S = 120  # vfs copies the whole image for each container: seconds, more on a busy machine
OWNER_LABEL = "org.eos-pipeline.tests.owner"  # host:pid of the test process that started the container
POSTGRES_CREDENTIALS = {"username": "pipeline", "password": "pipeline", "dbname": "pipeline"}  # test-only server
LOOPBACK = ("localhost", "127.0.0.1")


def _versions() -> dict[str, str]:
    lines = (REPO / "deploy" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


KAFKA_IMAGE = os.environ.get("EOS_KAFKA_IMAGE", f"localhost/eos-pipeline-kafka:{_versions()['KAFKA_VERSION']}")
POSTGRES_IMAGE = os.environ.get("EOS_POSTGRES_IMAGE", "localhost/eos-pipeline-postgres:15")


def build_images() -> None:
    """deploy/image/servers.sh (a warm run only compares digests). Needs podman; on an engine without it the images
    must have been built and loaded there already."""
    if shutil.which("podman") is None:
        return
    done = subprocess.run([str(SERVERS_SH)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{SERVERS_SH.relative_to(REPO)} failed:\n{done.stderr[-4000:]}")


@contextmanager
def podman_service(directory: Path) -> Iterator[str]:
    """`podman system service` on a socket of its own in `directory`, for as long as the block runs: yields the
    DOCKER_HOST address of its Docker-compatible API."""
    url = f"unix://{directory / 'podman.sock'}"
    log_path = directory / "podman-service.log"
    with open(log_path, "wb") as log:
        command = ["podman", "system", "service", "--time=0", url]
        service = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not answer on {url}:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        service.terminate()
        try:
            service.wait(15)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(5)


def _answers(docker_host: str) -> bool:
    try:
        client = docker.DockerClient(base_url=docker_host, timeout=2)  # asks for the API version: raises when down
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except DockerException:
        return False
    finally:
        client.close()


@contextmanager
def engine_on_this_machine() -> Iterator[None]:
    """testcontainers' address for published ports, for an engine that runs on this machine: 127.0.0.1. Its own
    guess inside a container (a /.dockerenv) is the container's gateway, where an engine outside would be."""
    saved = testcontainers_config.tc_host_override, testcontainers_config.connection_mode_override
    testcontainers_config.tc_host_override = "127.0.0.1"
    testcontainers_config.connection_mode_override = ConnectionMode.docker_host
    try:
        yield
    finally:
        testcontainers_config.tc_host_override, testcontainers_config.connection_mode_override = saved


def _engine(docker_host: str | None) -> AbstractContextManager[None]:
    """How testcontainers reaches the engine's published ports. An engine named by `docker_host`: as its caller has
    set up. The environment's (DOCKER_HOST, else docker-py's default socket), when nothing says where its ports are
    (TC_HOST, TESTCONTAINERS_CONNECTION_MODE): podman's API on a unix socket means podman runs on this machine, so
    127.0.0.1; testcontainers' own guess inside a container, the gateway, is wrong for it (and fails on podman's
    API). Any other engine: testcontainers' own rules."""
    if docker_host or testcontainers_config.tc_host_override or testcontainers_config.connection_mode_override:
        return nullcontext()
    local_podman = (get_docker_host() or "unix://").startswith("unix://") and is_podman()
    return engine_on_this_machine() if local_podman else nullcontext()


def _client_kw(docker_host: str | None) -> dict[str, Any]:
    return {"environment": {"DOCKER_HOST": docker_host}} if docker_host else {}


def owner() -> str:
    """The OWNER_LABEL value of this test process's containers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _sweep(client: DockerClient) -> None:
    """Removes the containers of test processes on this machine that have died (killed before removing them)."""
    host = socket.gethostname()
    for container in client.client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        owner_host, _, pid = container.labels.get(OWNER_LABEL, "").rpartition(":")
        if owner_host == host and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            container.remove(force=True)


def _prepare(container: DockerContainer, port: int, docker_host: str | None) -> DockerContainer:
    """Ryuk off, the image on the engine, the owner label, stale containers swept; the port published on loopback
    only when clients reach the engine over loopback (a test server needs no other interface), else where
    testcontainers publishes it."""
    testcontainers_config.ryuk_disabled = True
    container.with_kwargs(labels={OWNER_LABEL: owner()})
    client = container.get_docker_client()
    try:
        client.client.images.get(container.image)  # else testcontainers would try a registry that has no such image
    except ImageNotFound:
        raise RuntimeError(
            f"image {container.image} is not on the engine testcontainers uses "
            f"({docker_host or get_docker_host() or 'docker-py default'}): "
            f"deploy/image/servers.sh builds it with podman; for another engine, `podman save {container.image} | "
            "docker load`"
        ) from None
    _sweep(client)
    if client.get_connection_mode() is ConnectionMode.docker_host and client.host() in LOOPBACK:
        container.ports[str(port)] = ("127.0.0.1",)  # type: ignore[assignment]  # docker-py: (interface,) = any port
    return container


def _address(container: DockerContainer, port: int) -> tuple[str, int]:
    host = container.get_container_host_ip()
    # "localhost" may resolve to ::1 first, where the port is not published.
    return ("127.0.0.1" if host in LOOPBACK else host), container.get_exposed_port(port)


def _failure(what: str, container: DockerContainer, exc: BaseException) -> RuntimeError:
    """The error for a server that did not come up: the cause, where its clients looked for it, and its log."""
    hint = ""
    try:
        host = container.get_container_host_ip()
    except Exception as lookup:
        host = f"an address testcontainers could not find ({lookup!r})"
    if host not in LOOPBACK:
        hint = (
            f"\nclients look for its ports at {host} (testcontainers' guess); for an engine on this machine set "
            "TC_HOST=127.0.0.1 and TESTCONTAINERS_CONNECTION_MODE=docker_host"
        )
    return RuntimeError(f"the {what} container did not come up: {exc}{hint}\n--- its log ---\n{_logs(container)}")


def _logs(container: DockerContainer) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # the container may be gone: say so instead of hiding the first error
        return f"(no logs: {exc})"
    return (out + err).decode(errors="replace")[-4000:]


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, not starting with '-' (as Kafka's)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


class KafkaBroker(DockerContainer):
    """The broker image's one KRaft node. Its clients' port is published on a port the engine picks, so the address
    the broker advertises is only known once the container runs: its start script waits for this class to write
    that address into the container (KAFKA_ADVERTISED_ADDRESS_FILE), then starts the broker."""

    CLIENT_PORT = 9092
    ADDRESS_FILE = "/tmp/advertised-address"

    def __init__(self, image: str = KAFKA_IMAGE, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.with_exposed_ports(self.CLIENT_PORT)
        self.with_env("KAFKA_ADVERTISED_ADDRESS_FILE", self.ADDRESS_FILE)
        # A cluster id of its own: a client that reached another broker (a wrong advertised address can lead to one
        # on this machine) would see another id.
        self.with_env("KAFKA_CLUSTER_ID", new_cluster_id())
        self.bootstrap = ""

    def start(self) -> KafkaBroker:
        super().start()
        try:
            host, port = _address(self, self.CLIENT_PORT)
            self.bootstrap = f"{host}:{port}"
            self.copy_into_container(f"{self.bootstrap}\n".encode(), self.ADDRESS_FILE)
            LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(START_TIMEOUT_S).wait_until_ready(self)
            self._check_advertised()
        except Exception as exc:
            raise _failure("Kafka", self, exc) from exc
        return self

    def _check_advertised(self) -> None:
        """Clients bootstrap at the published port, then connect to what the broker advertises: it must be the same."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # held: its futures fail once it is collected
        nodes = admin.describe_cluster(request_timeout=20).result(30).nodes
        advertised = sorted(f"{node.host}:{node.port}" for node in nodes)
        if advertised != [self.bootstrap]:
            raise RuntimeError(f"the broker advertises {advertised}; its clients reach it at {self.bootstrap}")


@contextmanager
def kafka_server(docker_host: str | None = None, image: str = KAFKA_IMAGE) -> Iterator[str]:
    """A broker in a container for as long as the block runs: yields its bootstrap address."""
    with _engine(docker_host):
        broker = KafkaBroker(image, docker_client_kw=_client_kw(docker_host))
        with _prepare(broker, KafkaBroker.CLIENT_PORT, docker_host):
            yield broker.bootstrap


@contextmanager
def postgres_server(docker_host: str | None = None, image: str = POSTGRES_IMAGE) -> Iterator[str]:
    """PostgreSQL in a container for as long as the block runs: yields its DSN. Ready when it has said so in its log,
    testcontainers' own check (psql inside the container) has connected, and so has a client here, at the DSN."""
    with _engine(docker_host):
        server = PostgresContainer(image, driver=None, docker_client_kw=_client_kw(docker_host), **POSTGRES_CREDENTIALS)
        server.waiting_for(LogMessageWaitStrategy("ready to accept connections").with_startup_timeout(START_TIMEOUT_S))
        _prepare(server, server.port, docker_host)
        try:
            server.start()
            dsn = server.get_connection_url(host=_address(server, server.port)[0], driver=None)
            psycopg.connect(dsn, connect_timeout=10).close()
        except Exception as exc:
            failure = _failure("PostgreSQL", server, exc)
            server.stop()
            raise failure from exc
        try:
            yield dsn
        finally:
            server.stop()
