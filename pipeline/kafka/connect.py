"""Start-up check of the connection itself: bad credentials or an untrusted certificate fail at once, naming the
setting to fix.

librdkafka treats a failed SASL authentication or TLS handshake like a broker that is down: it logs, reconnects with
back-off and retries forever, and a runner waiting for metadata or a group would wait too. The errors do reach the
client's error callback at once (`_AUTHENTICATION`, `_SSL`), so one throw-away admin client with an error callback
asks the cluster to describe itself and stops at the first such error. A setting librdkafka rejects while creating
the client (an unreadable key, a wrong key password, an unknown property) fails here too, named the same way.

Messages name settings, never their values: librdkafka's own error texts hold no secret (a test greps them).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.kafka.clients import client_config
from pipeline.kafka.logs import librdkafka_log
from pipeline.redaction import SECRET_WORDS
from pipeline.settings import KAFKA_ENV_PREFIX, ConfigError, Settings

POLL_S = 0.1


class ConnectionRefused(ConfigError):
    """The cluster turned the client away (authentication, TLS) or the client could not be configured."""


def kafka_setting(prop: str) -> str:
    """The environment variable of a librdkafka property: ssl.ca.location -> PIPELINE_KAFKA_SSL_CA_LOCATION."""
    return KAFKA_ENV_PREFIX + prop.upper().replace(".", "_")


def connect_check(settings: Settings, timeout_s: float | None = None) -> None:
    """Returns once the cluster answered; raises ConnectionRefused naming the setting when the client cannot be
    built or the brokers refuse it, and ConfigError when no broker answered within timeout_s (default:
    CONNECT_TIMEOUT_MS). librdkafka's log lines are DEBUG here: the error raised quotes the last one."""
    timeout_s = settings.connect_timeout_ms / 1000 if timeout_s is None else timeout_s
    errors: list[KafkaError] = []
    quiet = librdkafka_log(settings.kafka_log_interval_ms, demote_to=logging.DEBUG)
    try:
        config: dict[str, Any] = {**client_config(settings), "error_cb": errors.append, "logger": quiet}
        admin = AdminClient(config)
    except KafkaException as e:
        raise ConnectionRefused(config_problem(e.args[0])) from None
    future = admin.describe_cluster(request_timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while not future.done() and time.monotonic() < deadline:
        admin.poll(POLL_S)  # serves error_cb
        for error in errors:
            if (refused := refusal(error)) is not None:
                future.cancel()
                raise ConnectionRefused(refused)
    if future.done():
        try:
            future.result()
            return
        except KafkaException as e:  # its timeout says less than a connection error the callback saw
            errors.insert(0, e.args[0])
    last = f" (last error: {errors[-1].str()})" if errors else ""
    raise ConfigError(
        f"BOOTSTRAP_SERVERS: no cluster metadata within {timeout_s:.0f}s from "
        f"{settings.bootstrap_servers!r}{last}; check PIPELINE_BOOTSTRAP_SERVERS and "
        f"{kafka_setting('security.protocol')} (or wait longer: CONNECT_TIMEOUT_MS)"
    )


def refusal(error: KafkaError) -> str | None:
    """What to fix for an error that will not go away by retrying, or None for one that may (a broker down)."""
    text = error.str()
    if error.code() == KafkaError._AUTHENTICATION:
        if "mechanism" in text.lower() and "unsupported" in text.lower():
            return f"{kafka_setting('sasl.mechanisms')}: the broker refuses this SASL mechanism ({text})"
        return (
            f"{kafka_setting('sasl.username')} / {kafka_setting('sasl.password')}: authentication failed, the "
            f"broker does not accept this user name and password ({text})"
        )
    if error.code() == KafkaError._SSL:
        if "certificate verify failed" in text:
            return (
                f"{kafka_setting('ssl.ca.location')}: the broker's certificate is not trusted (not signed by that "
                f"CA, or not issued for the host in PIPELINE_BOOTSTRAP_SERVERS) ({text})"
            )
        return f"TLS handshake failed: check the PIPELINE_KAFKA_SSL_* settings ({text})"
    return None


# Where librdkafka names the property it refused, in the texts of its versions 2.x.
_PROPERTY_PATTERNS = (
    re.compile(r'No such configuration property: "([^"]+)"'),
    re.compile(r'for configuration property "([^"]+)"'),
    re.compile(r"\b([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+) failed:"),
    re.compile(r"(?i)SASL (mechanism)|(JAAS)"),
)
_ALIASES = {"mechanism": "sasl.mechanisms", "sasl.mechanism": "sasl.mechanisms", "jaas": "sasl.jaas.config"}


def config_problem(error: KafkaError) -> str:
    """A client librdkafka refused to create: name the property's setting (the key's password with the key)."""
    text = error.str()
    # Every pattern captures the property in a group, so a match always has a lastindex (0, the whole match, is unused).
    prop = next((m.group(m.lastindex or 0) for p in _PROPERTY_PATTERNS if (m := p.search(text))), None)
    if prop is None:
        return f"the Kafka client cannot be created: {text} (check the PIPELINE_KAFKA_* settings)"
    prop = _ALIASES.get(prop.lower(), prop)
    if any(word in prop for word in SECRET_WORDS):  # 'Invalid value "<the secret>" for ...': keep the value out
        text = re.sub(r'Invalid value "[^"]*"', "Invalid value", text)
    settings = [kafka_setting(prop)]
    if prop == "ssl.key.location":  # an encrypted key that does not open: most likely its password
        settings.append(kafka_setting("ssl.key.password"))
    if prop == "ssl.keystore.location":
        settings.append(kafka_setting("ssl.keystore.password"))
    return f"{' / '.join(settings)}: the Kafka client cannot be created ({text})"
