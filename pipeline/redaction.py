"""Secrets kept out of logs, metrics and errors: a `Secret` string's repr() is '***', Kafka properties named like a
secret become one, and a PostgreSQL DSN is shown without its password. `pipeline.settings` applies them to every
setting it loads; its module docstring says what stays hidden where."""

from __future__ import annotations

import re

# Kafka properties whose values are secrets (also a schema registry's basic.auth.user.info, user:password).
SECRET_WORDS = ("password", "secret", "key", "token", "jaas", "oauthbearer", "user.info", "credentials")
REDACTED = "***"
_DSN_PASSWORDS = (  # a password inside a libpq DSN: URI user:password@, or password=... (quoted or not)
    re.compile(r"(?<=://)([^:/@]*):[^@/]*@"),
    re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
)


class Secret(str):
    """A string whose repr() is '***': it stays out of logs, tracebacks and printed settings. str(), f-strings and
    the clients see the real value (and it compares equal to it). json.dumps writes the real value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (URI or key=value form)."""
    uri, keywords = _DSN_PASSWORDS
    return keywords.sub(lambda m: m.group(1) + REDACTED, uri.sub(lambda m: f"{m.group(1)}:{REDACTED}@", str(dsn)))


def secret_if_named(name: str, value: str) -> str:
    """A Secret if the property's name says it holds one (SECRET_WORDS)."""
    return as_secret(value) if any(w in name.lower() for w in SECRET_WORDS) else value


def as_secret(value: str) -> str:
    return Secret(value) if value else value  # an empty one stays visible: "POSTGRES_DSN is empty" must be debuggable
