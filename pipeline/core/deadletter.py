"""Dead letters: a record that kept failing, written inside the same transaction that commits past it."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.app import HELD_HEADER, App, Output
from pipeline.serde import JSON

PREFIX = "eos.dlq."


def dead_letter_topic(app_name: str) -> str:
    return f"{app_name}-dlq"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error_type: str
    error_message: str
    attempts: int
    rejected: bool = False  # `process` raised Reject: dead-lettered on purpose (e.g. "late"), not after failures
    # A timer whose on_timer kept failing (not an input record): its eos.timer coordinates
    # (partition:position:clock:due:key); key and value are the timer's key and payload.
    timer: str = ""
    schema_id: int | None = None  # a registry serde's SchemaError: the schema id the record names (if it names one)

    def headers(self) -> list[tuple[str, bytes]]:
        fields: dict[str, object] = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "error.type": self.error_type,
            "error.message": self.error_message[:2000],
            "attempts": self.attempts,
        }
        if self.rejected:
            fields["rejected"] = 1
        if self.timer:
            fields["timer"] = self.timer
        if self.schema_id is not None:
            fields["schema.id"] = self.schema_id
        return [(PREFIX + name, str(value).encode()) for name, value in fields.items()]

    @staticmethod
    def from_record(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None) -> DeadLetter:
        fields = {name[len(PREFIX) :]: raw.decode() for name, raw in headers or () if name.startswith(PREFIX)}
        return DeadLetter(
            topic=fields["topic"],
            partition=int(fields["partition"]),
            offset=int(fields["offset"]),
            key=key,
            value=value,
            error_type=fields["error.type"],
            error_message=fields["error.message"],
            attempts=int(fields["attempts"]),
            rejected=fields.get("rejected") == "1",
            timer=fields.get("timer", ""),
            schema_id=int(fields["schema.id"]) if "schema.id" in fields else None,
        )


def held_dead_letter(app: App, output: Output) -> DeadLetter:
    """The dead letter of a record `process` held earlier (`app.dead_letter`, an output to DEAD_LETTERS): its bytes
    as its input's serdes write them, and its own coordinates, so that the checker counts it as that record's fate.
    Both sinks write it in the transaction of the output that released it."""
    meta = JSON.deserialize(dict(output.headers)[HELD_HEADER])
    stream = app.stream(meta["topic"])  # the held record says its input as the App declares it
    return DeadLetter(
        stream.topic,
        meta["partition"],
        meta["offset"],
        stream.key_serde.serialize(output.key),
        stream.value_serde.serialize(output.value),
        meta["error_type"],
        meta["message"],
        1,
        rejected=True,
    )
