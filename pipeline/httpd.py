"""A small HTTP/1.1 server for the health, metrics and query endpoints (pipeline/metrics.py): GET only, kept-alive
connections, a thread per connection, one write per answer.

Why not http.server's BaseHTTPRequestHandler: it parses every request's headers with the email package and walks its
handler machinery, ~40 us of the ~61 us a one-key query cost in the HTTP thread, all of it holding the GIL that the
poll loop wants too (BENCHMARKS.md, issue 34). Here the bytes go to httptools (llhttp, the parser of Node.js and of
uvicorn) straight from the socket, and the answer is written in one send.

What it accepts: `GET <target> HTTP/1.0 or 1.1`, headers as llhttp takes them, a body read and dropped (at most
MAX_BODY bytes). Anything else is answered with 400, 413, 414, 431 or 501 and the connection closed.
HTTP/1.1 keeps the connection unless the client says `Connection: close`; HTTP/1.0 closes it unless `keep-alive`.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

import httptools

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


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]  # by lower-case name (a repeated one: the last)
    keep_alive: bool


class _Requests:
    """The requests of one connection as httptools (llhttp, the parser uvicorn uses) finds them in the bytes received:
    complete ones queued in order, several from one packet included. Bodies are read past and dropped (a GET has
    none); the limits below are this server's, checked as the bytes come."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.complete: deque[_Request] = deque()
        self._url, self._head_bytes, self._in_body, self._body_bytes = b"", 0, False, 0
        self._headers: dict[str, str] = {}
        self._header_lines = 0

    def feed(self, data: bytes) -> None:
        """_BadRequest for a request this server refuses (requests complete before it stay queued)."""
        if not self._in_body:  # a head's bytes, counted until it ends (llhttp keeps a long header line to itself)
            self._head_bytes += len(data)
            if self._head_bytes > MAX_LINE + MAX_HEADERS * 256:
                raise _BadRequest(431, "request head too long")
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            raise e.__context__ if isinstance(e.__context__, _BadRequest) else _BadRequest(400, str(e)) from e
        except httptools.HttpParserInvalidMethodError as e:
            raise _BadRequest(501, "method not supported: GET only") from e
        except httptools.HttpParserUpgrade as e:
            raise _BadRequest(501, "protocol upgrades are not supported") from e
        except httptools.HttpParserError as e:
            raise _BadRequest(400, f"malformed request: {e}") from e

    # -- httptools' callbacks ----------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._header_lines, self._body_bytes = b"", {}, 0, 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            raise _BadRequest(414, "request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        if self._header_lines > MAX_HEADERS:
            raise _BadRequest(431, f"more than {MAX_HEADERS} header lines")
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        self._in_body = True
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            raise _BadRequest(400, "a request line is: METHOD target HTTP/1.1")
        length = self._headers.get("content-length", "0")
        if length.isdigit() and int(length) > MAX_BODY:
            raise _BadRequest(413, f"a request body of more than {MAX_BODY} bytes")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY:
            raise _BadRequest(413, f"a request body of more than {MAX_BODY} bytes")

    def on_message_complete(self) -> None:
        self._in_body, self._head_bytes = False, 0
        method = self.parser.get_method().decode("latin-1")
        target = self._url.decode("latin-1")
        self.complete.append(_Request(method, target, self._headers, self.parser.should_keep_alive()))


class _Connection(socketserver.BaseRequestHandler):
    """One client connection: its requests answered one after the other, in order, until it closes or asks to."""

    respond: Respond
    request: socket.socket

    def setup(self) -> None:
        # Without it the answer of a kept-alive connection waited for the client's delayed ACK (Nagle): 40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._requests = _Requests()

    def handle(self) -> None:
        try:
            while self._next_requests():
                pass
        except (ConnectionError, TimeoutError):
            pass  # the client went away: nothing to answer

    def _next_requests(self) -> bool:
        """Reads once and answers every request complete so far; False when the connection is to close."""
        data = self.request.recv(65_536)
        if not data:
            return False
        refused: _BadRequest | None = None
        try:
            self._requests.feed(data)
        except _BadRequest as e:
            refused = e
        while self._requests.complete:
            if not self._answer(self._requests.complete.popleft()):
                return False
        if refused is not None:
            self._send(reply_bytes(refused.status, f"{refused}\n".encode(), {"Content-Type": "text/plain"}, True))
            return False
        return True

    def _answer(self, request: _Request) -> bool:
        """Answers one request; False when the connection is to close."""
        if request.method != "GET":
            body = f"method {request.method} not supported: GET only\n".encode("latin-1", "replace")
            self._send(reply_bytes(501, body, {"Content-Type": "text/plain"}, close=True))
            return False
        try:
            status, body, reply_headers = self.respond(request.target, request.headers)
        except Exception as e:  # a bug behind a path: this request fails, not the server
            # where, not the message nor the traceback's: either may hold a value of the state or a token
            where = traceback.extract_tb(e.__traceback__)[-1]
            path = request.target.lstrip("/").partition("?")[0].partition("/")[0]  # its first segment: not a key
            log.error("answering GET /%s failed: %s at %s:%s", path, type(e).__name__, where.filename, where.lineno)
            self._send(reply_bytes(500, b"the request failed; see the log\n", {"Content-Type": "text/plain"}, True))
            return False
        self._send(reply_bytes(status, body, reply_headers, close=not request.keep_alive))
        return request.keep_alive

    def _send(self, data: bytes) -> None:
        self.request.sendall(data)
