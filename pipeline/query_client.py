"""A client of the interactive queries (pipeline/core/queries.py) for other services and `pipeline query`: one GET,
following the owner's redirect (307) and waiting out a restore (503 with Retry-After) up to a deadline, on kept-alive
connections (one per address and thread asking at once). Standard library only: a service that only asks needs
nothing else of this package.

    from pipeline.query_client import query
    answer = query("http://orders-0:9400", "acct-1", min_offset=1234, token=os.environ["QUERY_TOKEN"])
    answer.value, answer.partition, answer.offset       # the committed value, where it lives, the position it reflects
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

MAX_REDIRECTS = 3


class QueryError(RuntimeError):
    """The endpoint refused or could not answer (the message has its status and reason)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Answer:
    status: int  # 200 found, 404 not in the committed state
    body: dict[str, Any]
    hops: list[str] = field(default_factory=list)  # the addresses asked, the answering one last

    @property
    def value(self) -> Any:
        return self.body.get("value")

    @property
    def partition(self) -> int | None:
        return self.body.get("partition")

    @property
    def offset(self) -> int | None:
        """The partition's committed input offset the answer reflects (every record below it, none from it on)."""
        return self.body.get("offset")


def query_path(key: str | None = None, /, **params: Any) -> str:
    """/state/<key>?..., or /state?prefix=... for a range (key=None); parameters that are None are left out."""
    given = {name: ("1" if value is True else value) for name, value in params.items() if value is not None}
    path = "/state" if key is None else f"/state/{quote(key, safe='')}"
    return f"{path}?{urlencode(given)}" if given else path


def query(
    url: str,
    key: str | None = None,
    *,
    token: str = "",
    timeout_s: float = 5.0,
    partition_key: str | None = None,
    **params: Any,
) -> Answer:
    """GET the committed value of `key` (or, key None, a range: prefix=, limit=, and the partition of
    `partition_key` or partition=) from the instance at `url` (http://host:port), following redirects to the owner;
    params: min_offset=, partition=, allow_standby=True (a standby copy may answer: body["standby"], ["behind"]).
    A 503 (restoring, moving, a min_offset not reached) is asked again after its Retry-After until `timeout_s`;
    QueryError for anything but 200 and 404."""
    deadline = time.monotonic() + timeout_s
    params = {**params, "key": partition_key}
    target, path = url.rstrip("/"), query_path(key, **params)
    hops: list[str] = []
    redirects = 0
    while True:
        status, headers, body = _get(target + path, token, max(0.1, deadline - time.monotonic()))
        hops.append(target)
        if status in (200, 404):
            return Answer(status, body, hops)
        if status == 307 and redirects < MAX_REDIRECTS:
            redirects += 1
            moved = urlsplit(headers.get("location", ""))
            target, path = f"{moved.scheme}://{moved.netloc}", moved.path + (f"?{moved.query}" if moved.query else "")
            continue
        wait = float(headers.get("retry-after", "0") or 0)
        if status == 503 and time.monotonic() + wait < deadline:
            time.sleep(wait)
            target, path, redirects = url.rstrip("/"), query_path(key, **params), 0  # the owner may have moved
            continue
        reason = f"redirected {redirects} times: {' -> '.join(hops)}" if status == 307 else body.get("error", body)
        raise QueryError(status, str(reason))


class _Connections:
    """Kept-alive connections by host:port, each used by one request at a time: a service asking often pays the TCP
    handshake (and the server its thread) once, not per query; a redirect followed lands on the owner's kept one."""

    MAX_IDLE = 8  # per address: more threads asking at once each open their own, and close it after

    def __init__(self) -> None:
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self, netloc: str, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection to netloc, whether it was kept from an earlier request)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the sockets are its parent's too, never to share
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(netloc)
            connection = idle.pop() if idle else None
        if connection is None:
            return http.client.HTTPConnection(netloc, timeout=timeout_s), False
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        return connection, True

    def give_back(self, netloc: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(netloc, [])
            if len(idle) < self.MAX_IDLE:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            connections = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for connection in connections:
            connection.close()


_CONNECTIONS = _Connections()


def close_connections() -> None:
    """Closes the kept-alive connections of this process's queries (they are also closed at exit)."""
    _CONNECTIONS.close()


def _get(url: str, token: str, timeout_s: float) -> tuple[int, dict[str, str], dict[str, Any]]:
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        try:
            status, reply_headers, raw = _exchange(parts.netloc, target, headers, timeout_s, kept=True)
        except _StaleConnection:  # the server closed a kept connection while it was idle: a GET is asked again
            status, reply_headers, raw = _exchange(parts.netloc, target, headers, timeout_s, kept=False)
    except (OSError, http.client.HTTPException) as e:
        raise QueryError(0, f"{parts.netloc}: {e}") from e
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"error": raw.decode("utf-8", "replace").strip()}
    return status, reply_headers, body if isinstance(body, dict) else {"value": body}


class _StaleConnection(Exception):
    pass


def _exchange(
    netloc: str, target: str, headers: dict[str, str], timeout_s: float, kept: bool
) -> tuple[int, dict[str, str], bytes]:
    """One GET on a kept connection to netloc if there is one (`kept`), else on a new one; the connection is kept
    for the next unless the server said it closes it."""
    connection, reused = _CONNECTIONS.take(netloc, timeout_s) if kept else (None, False)
    if connection is None:
        connection = http.client.HTTPConnection(netloc, timeout=timeout_s)
    try:
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as e:
        connection.close()
        if reused:
            raise _StaleConnection from e
        raise
    except BaseException:
        connection.close()
        raise
    reply_headers = {name.lower(): value for name, value in response.getheaders()}
    if response.will_close:
        connection.close()
    else:
        _CONNECTIONS.give_back(netloc, connection)
    return response.status, reply_headers, raw
