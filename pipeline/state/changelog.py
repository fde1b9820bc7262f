"""The changelog (incremental snapshot) topic: what one input partition's transactions did to its state.

Partition p of `<app>-changelog` holds p's state changes, keyed by state key (value = encoded state value, or
no value for a delete), and after the changes of each transaction one checkpoint record naming the next input
offset of p that transaction covers. Everything is written inside the transaction, so read_committed readers
see whole transactions or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

CHECKPOINT_KEY = b"__eos_checkpoint__"
CHECKPOINT_HEADER = ("eos.checkpoint", b"1")


def changelog_topic(app_name: str) -> str:
    return f"{app_name}-changelog"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    input_topic: str
    input_partition: int
    next_input_offset: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {"topic": self.input_topic, "partition": self.input_partition, "next_offset": self.next_input_offset}
        )

    @staticmethod
    def decode(value: bytes) -> Checkpoint:
        fields = orjson.loads(value)
        return Checkpoint(fields["topic"], fields["partition"], fields["next_offset"])


def is_checkpoint(key: bytes | None, headers: list[tuple[str, bytes]] | None) -> bool:
    return key == CHECKPOINT_KEY and bool(headers) and CHECKPOINT_HEADER in headers
