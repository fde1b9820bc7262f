"""pipeline/query_client.py keeps its connections: one per address for a thread asking again and again, the redirect
followed on the owner's kept one, and a kept connection the server closed meanwhile replaced without an error."""

from __future__ import annotations

import multiprocessing
import socket
import threading
from collections.abc import Iterator, Mapping

import pytest

from pipeline.core.queries import Queries
from pipeline.examples.running_totals import app as running_totals
from pipeline.metrics import HealthServer, Metrics
from pipeline.query_client import close_connections, query
from pipeline.settings import Settings
from pipeline.testing.driver import AppDriver


@pytest.fixture(autouse=True)
def no_kept_connections() -> Iterator[None]:
    close_connections()
    yield
    close_connections()


def test_one_kept_connection_per_address_and_the_redirect_followed_on_the_owners() -> None:
    driver = AppDriver(running_totals, partitions=2)
    driver.send("acct-1", {"id": 1, "amount": 5})
    p = driver._partition(None, b"acct-1")
    s = Settings.load(env={}, metrics_port=1, query_enabled=True, query_partitioner="crc32")
    directory: dict[int, str] = {}
    connections: dict[int, list[int]] = {1 - p: [], p: []}  # per server: the thread (one per connection) that answered
    servers = []
    for owned in (1 - p, p):  # the first one asked does not own the key's partition
        queries = Queries(driver.app, s, {owned: driver.tasks[owned]}, lambda: 2, directory.get)

        def route(
            path: str, headers: Mapping[str, str], owned: int = owned, queries: Queries = queries
        ) -> tuple[int, bytes, Mapping[str, str]] | None:
            connections[owned].append(threading.get_ident())
            return queries.route(path, headers)

        servers.append(HealthServer(Metrics(), lambda: True, 0, "127.0.0.1", routes=route).start())
        directory[owned] = f"127.0.0.1:{servers[-1].port}"
    try:
        for _ in range(3):
            answer = query(f"http://{directory[1 - p]}", "acct-1")
            assert (answer.value, len(answer.hops)) == ([1, 5], 2)
    finally:
        for server in servers:
            server.stop()
    assert [len(asked) for asked in connections.values()] == [3, 3]
    assert [len(set(asked)) for asked in connections.values()] == [1, 1], connections


def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    """A server that answers one request per connection, then closes it without saying so (as one restarted or
    timing out idle connections does): the next query finds the kept connection dead and asks on a new one."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []
    body = b'{"key": "k", "value": 1}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            with connection:
                connection.recv(65536)
                connection.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert [query(url, "k").value for _ in range(3)] == [1, 1, 1]
    finally:
        listener.close()
    assert len(accepted) == 3


def test_a_forked_child_does_not_use_its_parents_kept_connections() -> None:
    """The child's socket would be the parent's too: two processes' requests and answers interleaved on it."""
    asked: list[int] = []  # the server thread (one per connection) of each request

    def route(path: str, headers: Mapping[str, str]) -> tuple[int, bytes, Mapping[str, str]] | None:
        asked.append(threading.get_ident())
        return 200, b'{"value": 1}', {"Content-Type": "application/json"}

    server = HealthServer(Metrics(), lambda: True, 0, "127.0.0.1", routes=route).start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert query(url, "k").value == 1
        child = multiprocessing.get_context("fork").Process(target=query, args=(url, "k"))
        child.start()
        child.join(10)
        assert child.exitcode == 0
        assert query(url, "k").value == 1  # the parent's kept connection still works
    finally:
        server.stop()
    assert asked[0] == asked[2] != asked[1], asked
