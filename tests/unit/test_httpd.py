"""The small HTTP/1.1 server behind /metrics, /ready, /live and the queries (pipeline/httpd.py): kept-alive
connections, several requests in one packet, the request forms it refuses, and clients that are not this project's
(http.client, urllib) still served."""

from __future__ import annotations

import http.client
import socket
import urllib.request
from collections.abc import Iterator, Mapping

import pytest

from pipeline.core.queries import split_target
from pipeline.httpd import HttpServer

Seen = list[tuple[str, dict[str, str]]]


@pytest.fixture
def served() -> Iterator[tuple[int, Seen]]:
    """A server answering `<target>` with the target and recording what it was asked."""
    seen: Seen = []

    def respond(target: str, headers: Mapping[str, str]) -> tuple[int, bytes, Mapping[str, str]]:
        seen.append((target, dict(headers)))
        if target == "/bug":
            raise KeyError("a value that must not leave the process")
        status = 404 if target == "/missing" else 200
        return status, target.encode(), {"Content-Type": "text/plain"}

    server = HttpServer("127.0.0.1", 0, respond).start()
    yield server.port, seen
    server.stop()


def read_answer(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One answer from `sock` (more bytes than it may stay in `buffer` for the next)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before an answer")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        rest += sock.recv(65536)
    buffer[:] = rest[length:]
    return int(lines[0].split()[1]), headers, rest[:length]


def closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    return sock.recv(1) == b""


def test_a_kept_alive_connection_answers_request_after_request(served: tuple[int, Seen]) -> None:
    port, seen = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buffer = bytearray()
        for path in ("/a", "/b?x=1", "/missing"):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: h\r\nX-Token: Bearer t\r\n\r\n".encode())
            status, headers, body = read_answer(sock, buffer)
            assert (status, body, headers["content-type"]) == (
                404 if path == "/missing" else 200,
                path.encode(),
                "text/plain",
            )
            assert "connection" not in headers
    assert seen[0] == ("/a", {"host": "h", "x-token": "Bearer t"})


def test_requests_sent_together_are_answered_in_order(served: tuple[int, Seen]) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        # a body on a GET is read past; blank lines between requests are tolerated
        sock.sendall(
            b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n\r\nGET /2 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /3 HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        buffer = bytearray()
        assert [read_answer(sock, buffer)[2] for _ in range(3)] == [b"/1", b"/2", b"/3"]
        assert closed(sock)


@pytest.mark.parametrize(
    ("request_head", "keeps"),
    [
        (b"GET /x HTTP/1.1\r\n\r\n", True),
        (b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n", False),
        (b"GET /x HTTP/1.0\r\n\r\n", False),
        (b"GET /x HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True),
    ],
)
def test_the_connection_closes_when_the_client_asks_or_speaks_http_1_0(
    served: tuple[int, Seen], request_head: bytes, keeps: bool
) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_head)
        status, headers, _ = read_answer(sock, bytearray())
        assert status == 200 and ("connection" not in headers) == keeps
        if keeps:
            sock.sendall(b"GET /y HTTP/1.1\r\n\r\n")
            assert read_answer(sock, bytearray())[2] == b"/y"
        else:
            assert headers["connection"] == "close" and closed(sock)


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 501),
        (b"GET /x\r\n\r\n", 400),
        (b"GET /x SPDY/3\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nHost : h\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n20000\r\n" + b"x" * 70_000, 413),
        (b"GET /x HTTP/1.1\r\nContent-Length: many\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", 413),
        (b"GET /x HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n", 431),
        (b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_a_request_it_does_not_take_is_refused_and_the_connection_closed(
    served: tuple[int, Seen], request_head: bytes, status: int
) -> None:
    port, seen = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_head)
        answered, headers, _ = read_answer(sock, bytearray())
        assert (answered, headers["connection"]) == (status, "close")
        assert closed(sock)
    assert not seen


def test_a_failing_answer_is_a_500_without_its_message(
    served: tuple[int, Seen], caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /bug HTTP/1.1\r\n\r\n")
        status, headers, body = read_answer(sock, bytearray())
        assert (status, headers["connection"]) == (500, "close") and b"must not" not in body
        assert closed(sock)
    assert "KeyError at" in caplog.text and "must not" not in caplog.text


def test_a_request_head_without_end_is_refused_once_too_long(served: tuple[int, Seen]) -> None:
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\n" + b"A: " + b"b" * 100_000)
        assert read_answer(sock, bytearray())[0] == 431


def test_standard_clients_are_served(served: tuple[int, Seen]) -> None:
    port, _ = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/u?k=v") as reply:  # HTTP/1.1, Connection: close
        assert (reply.status, reply.read()) == (200, b"/u?k=v")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for path in ("/1", "/2"):  # one kept-alive connection
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.read() == path.encode()
    connection.close()


@pytest.mark.parametrize(
    ("target", "path", "params"),
    [
        ("/state/k", "/state/k", {}),
        ("/state/a%2Fb?min_offset=3&x=1&x=2", "/state/a%2Fb", {"min_offset": "3", "x": "2"}),
        ("/state?prefix=a+b%26c&limit=&flag", "/state", {"prefix": "a b&c"}),
        ("/state/k#frag?x=1", "/state/k", {}),
    ],
)
def test_a_target_splits_as_urlsplit_and_parse_qs_split_it(target: str, path: str, params: dict[str, str]) -> None:
    assert split_target(target) == (path, params)
