"""PostgreSQL for the tests: `POSTGRES_DSN` if set, else testcontainers when a Docker engine answers, else the
project's own local server (deploy/local/postgres.sh). One server per test session; a fresh schema per test."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support import docker_available

POSTGRES_SH = Path(__file__).resolve().parents[2] / "deploy" / "local" / "postgres.sh"
CONNECT_TIMEOUT_S = 10


def _postgres_sh(*args: str) -> str:
    try:
        done = subprocess.run([str(POSTGRES_SH), *args], check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{POSTGRES_SH.name} {' '.join(args)} failed:\n{exc.stderr.strip()}") from exc
    return done.stdout.strip()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    if dsn := os.environ.get("POSTGRES_DSN"):
        yield dsn
        return
    if docker_available():
        from tests.image.servers import build_images, postgres_server  # imports testcontainers only when it is used

        build_images()
        with postgres_server() as dsn:
            yield dsn
        return
    was_running = "running" in _postgres_sh("status")
    _postgres_sh("start")
    yield _postgres_sh("dsn")
    if not was_running and os.environ.get("KEEP_POSTGRES") != "1":
        _postgres_sh("stop")


@pytest.fixture(autouse=True)
def _postgres_shared_or_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """make test runs the suite in lanes side by side (tests/run.sh), and every lane may use the one PostgreSQL
    server: a test that uses it holds a shared lock on it, one that kills it (`postgres_alone`) the exclusive lock,
    so the kill never lands in another lane's test. flock: released by the kernel when a killed run's file closes."""
    if "postgres_dsn" not in request.fixturenames:
        yield
        return
    dsn = request.getfixturevalue("postgres_dsn")
    name = f"eos-pipeline-postgres-{hashlib.sha256(dsn.encode()).hexdigest()[:12]}.lock"
    with open(Path(tempfile.gettempdir()) / name, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if "postgres_alone" in request.fixturenames else fcntl.LOCK_SH)
        yield


@pytest.fixture
def postgres_alone() -> None:
    """Asked for by a test that kills or stops the PostgreSQL server: it runs while no other test uses it."""


def connect(dsn: str, **kwargs: object) -> psycopg.Connection:
    """A connection with bounded waits: connecting, and locks (a leaked transaction must not hang a test)."""
    return psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S, options="-c lock_timeout=10s", **kwargs)


@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A schema that exists for this test only (dropped with everything in it afterwards)."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
