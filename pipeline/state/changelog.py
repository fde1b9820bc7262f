"""The changelog (incremental snapshot) topic: what one input partition's transactions did to its state.

Partition p of `<app>-changelog` holds p's state changes, keyed by state key (value = encoded state value, or
no value for a delete), and after the changes of each transaction one checkpoint record naming the next input
offset of p that transaction covers. Everything is written inside the transaction, so read_committed readers
see whole transactions or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

CHECKPOINT_KEY = b"__eos_checkpoint__"
CHECKPOINT_HEADER = ("eos.checkpoint", b"1")


def changelog_topic(app_name: str) -> str:
    return f"{app_name}-changelog"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where one transaction of task p left its inputs. A one-input App: the input's next offset. Several inputs
    (docs/inputs.md) also: `offsets`, every co-partitioned topic's next offset (inputs, then tables), and `order`, the
    order the transaction took their records in, as runs "index:count,..." (index into the App's co_partitioned
    topics): what lets the checker replay exactly the interleaving the task chose."""

    input_topic: str
    input_partition: int
    next_input_offset: int | None
    offsets: Mapping[str, int | None] = field(default_factory=dict)
    order: str = ""

    def encode(self) -> bytes:
        fields: dict[str, object] = {
            "topic": self.input_topic,
            "partition": self.input_partition,
            "next_offset": self.next_input_offset,
        }
        if self.offsets:
            fields["offsets"] = dict(self.offsets)
            fields["order"] = self.order
        return orjson.dumps(fields)

    @staticmethod
    def decode(value: bytes | None) -> Checkpoint:
        if value is None:
            raise ValueError("a checkpoint record without a value")
        fields = orjson.loads(value)
        return Checkpoint(
            fields["topic"],
            fields["partition"],
            fields["next_offset"],
            fields.get("offsets", {}),
            fields.get("order", ""),
        )

    def covers(self) -> dict[str, int | None]:
        """The next offset of every topic this checkpoint names (the input's alone for a one-input App)."""
        return dict(self.offsets) if self.offsets else {self.input_topic: self.next_input_offset}


def order_runs(order: str) -> list[tuple[int, int]]:
    """ "0:3,1:2" -> [(0, 3), (1, 2)]."""
    return [(int(i), int(n)) for i, n in (run.split(":") for run in order.split(","))] if order else []


def is_checkpoint(key: bytes | None, headers: list[tuple[str, bytes]] | None) -> bool:
    return key == CHECKPOINT_KEY and headers is not None and CHECKPOINT_HEADER in headers
