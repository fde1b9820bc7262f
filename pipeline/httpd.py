"""A small HTTP/1.1 server for the health, metrics and query endpoints (pipeline/metrics.py): GET only, kept-alive
connections, a thread per connection, one write per answer.

Why not http.server's BaseHTTPRequestHandler: it parses every request's headers with the email package and walks its
handler machinery, ~40 us of the ~61 us a one-key query cost in the HTTP thread, all of it holding the GIL that the
poll loop wants too (BENCHMARKS.md, issue 34). Here a request is its request line and header lines split as bytes.

What it accepts: `GET <target> HTTP/1.x`, header lines `name: value`, lines ending in CRLF, no body (a Content-Length
body is read and dropped, a chunked one refused). Anything else is answered with 400, 413, 414, 431 or 501 and the
connection closed.
HTTP/1.1 keeps the connection unless the client says `Connection: close`; HTTP/1.0 closes it unless `keep-alive`.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import traceback
from collections.abc import Callable, Mapping
from http import HTTPStatus

# (request target with its query string, request headers by lower-case name) -> (status, body, response headers
# with Content-Type)
Respond = Callable[[str, Mapping[str, str]], tuple[int, bytes, Mapping[str, str]]]

log = logging.getLogger(__name__)
MAX_LINE = 65_536  # bytes of a request line or header line (as http.server)
MAX_HEADERS = 100  # header lines of one request (as http.server)
MAX_BODY = 65_536  # bytes of a request body read and dropped; a larger one is refused
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class _ThreadingServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True  # a kept-alive connection's thread does not hold the process at exit
    allow_reuse_address = True  # a restarted instance binds its port again at once (as http.server)
    request_queue_size = 128


class HttpServer:
    """Serves `respond` on host:port from a background thread (`start`, `stop`; `port` once bound)."""

    def __init__(self, host: str, port: int, respond: Respond, name: str = "http") -> None:
        handler = type("Handler", (_Connection,), {"respond": staticmethod(respond)})
        self._server = _ThreadingServer((host, port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def reply_bytes(status: int, body: bytes, headers: Mapping[str, str], close: bool = False) -> bytes:
    """Status line, headers and body as one buffer: a second write would wait for the GIL again (the poll loop takes
    it at the first write's release, for up to the switch interval) while the client waits."""
    head = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head += f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n\r\n" if close else "\r\n")
    return head.encode("latin-1") + body


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Connection(socketserver.BaseRequestHandler):
    """One client connection: its requests one after the other until it closes or asks to. Read straight from the
    socket into one buffer and split there: a request costs one recv and one send."""

    respond: Respond
    request: socket.socket

    def setup(self) -> None:
        # Without it the answer of a kept-alive connection waited for the client's delayed ACK (Nagle): 40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def handle(self) -> None:
        try:
            while self._one_request():
                pass
        except (ConnectionError, TimeoutError):
            pass  # the client went away: nothing to answer

    def _one_request(self) -> bool:
        """Reads and answers one request; False when the connection is to close."""
        try:
            request = self._read_request()
            if request is None:
                return False
            method, target, keep_alive, headers = request
        except _BadRequest as e:
            self._send(reply_bytes(e.status, f"{e}\n".encode(), {"Content-Type": "text/plain"}, close=True))
            return False
        if method != "GET":
            body = f"method {method} not supported: GET only\n".encode("latin-1", "replace")
            self._send(reply_bytes(501, body, {"Content-Type": "text/plain"}, close=True))
            return False
        try:
            status, body, reply_headers = self.respond(target, headers)
        except Exception as e:  # a bug behind a path: this request fails, not the server
            # where, not the message nor the traceback's: either may hold a value of the state or a token
            where = traceback.extract_tb(e.__traceback__)[-1]
            path = target.lstrip("/").partition("?")[0].partition("/")[0]  # its first segment: not a key
            log.error("answering GET /%s failed: %s at %s:%s", path, type(e).__name__, where.filename, where.lineno)
            self._send(reply_bytes(500, b"the request failed; see the log\n", {"Content-Type": "text/plain"}, True))
            return False
        self._send(reply_bytes(status, body, reply_headers, close=not keep_alive))
        return keep_alive

    def _read_request(self) -> tuple[str, str, bool, dict[str, str]] | None:
        """(method, target, keep-alive, headers by lower-case name); None at the end of the connection."""
        head = self._read_head()
        if head is None:
            return None
        request_line, *header_lines = head.split(b"\r\n")
        if len(request_line) > MAX_LINE:
            raise _BadRequest(414, "request line too long")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise _BadRequest(400, "a request line is: METHOD target HTTP/1.1")
        method, target, version = (part.decode("latin-1") for part in parts)
        headers = _headers(header_lines)
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        self._drop_body(headers)
        return method, target, keep_alive, headers

    def _read_head(self) -> bytes | None:
        """The next request's request line and header lines (up to the blank line, which is consumed); None when the
        client closed the connection between requests. Lines end with CRLF (RFC 9112)."""
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            self._buffer = self._buffer.lstrip(b"\r\n")  # blank lines before a request are tolerated (RFC 9112 2.2)
            if len(self._buffer) > MAX_LINE + MAX_HEADERS * 256:
                raise _BadRequest(431, "request head too long")
            chunk = self.request.recv(65_536)
            if not chunk:
                if self._buffer:
                    raise ConnectionResetError("the client closed the connection inside a request")
                return None
            self._buffer += chunk
        head, self._buffer = self._buffer[:end].lstrip(b"\r\n"), self._buffer[end + 4 :]
        return head

    def _drop_body(self, headers: Mapping[str, str]) -> None:
        """A GET has no body; one sent all the same is read past, so that the next request starts where it should."""
        if "transfer-encoding" in headers:
            raise _BadRequest(501, "a chunked request body is not supported")
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise _BadRequest(400, "Content-Length is not a number")
        if int(length) > MAX_BODY:
            raise _BadRequest(413, f"a request body of more than {MAX_BODY} bytes")
        while len(self._buffer) < int(length):
            chunk = self.request.recv(65_536)
            if not chunk:
                raise ConnectionResetError("the client closed the connection inside a request body")
            self._buffer += chunk
        self._buffer = self._buffer[int(length) :]

    def _send(self, data: bytes) -> None:
        self.request.sendall(data)


def _headers(lines: list[bytes]) -> dict[str, str]:
    """Header lines `name: value` by lower-case name (a repeated one: the last)."""
    if len(lines) > MAX_HEADERS:
        raise _BadRequest(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise _BadRequest(400, "a header line is: name: value")
        if len(line) > MAX_LINE:
            raise _BadRequest(431, "header line too long")
        headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
    return headers
