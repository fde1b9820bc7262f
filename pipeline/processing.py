"""Turning one input record into outputs, the same way in both sinks: decode, call `process`, and on failure undo,
back off and try again, then dead-letter or stop (docs/guarantees.md: no-silent-skip)."""

from __future__ import annotations

from confluent_kafka import Message

from pipeline.app import App, Record


def record_from_message(app: App, msg: Message) -> Record:
    """A consumed message as the Record `process` receives (decoding may raise: the record is then poison)."""
    return app.decode(msg.key(), msg.value(), msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1],
                      msg.headers())
