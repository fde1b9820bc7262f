"""What a compaction run did, per partition (published, skipped or failed, and why), and its printed summary."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionReport:
    partition: int
    status: str  # published | skipped | failed
    reason: str = ""
    snapshot_id: str | None = None
    generation: int | None = None
    base_id: str | None = None
    changelog_range: tuple[int, int] | None = None
    changelog_records: int = 0
    base_entries: int = 0
    chunks: int = 0
    entries: int = 0
    bytes: int = 0
    deleted: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        if self.status == "published":
            rng = self.changelog_range
            assert rng is not None  # a published snapshot covers a changelog range
            text = (
                f"p{self.partition}: published {self.snapshot_id} (generation {self.generation}): read "
                f"{self.base_entries} entries of {self.base_id or 'no previous snapshot'} and "
                f"{self.changelog_records} changelog records [{rng[0]}, {rng[1]}); wrote {self.chunks} chunks, "
                f"{self.entries} entries, {self.bytes} bytes"
            )
            if self.deleted:
                text += "; deleted below " + ", ".join(f"{t}@{o}" for t, o in self.deleted.items())
            return text
        return f"p{self.partition}: {self.status}: {self.reason}"


@dataclass
class Report:
    partitions: dict[int, PartitionReport]
    seconds: float = 0.0

    @property
    def published(self) -> list[int]:
        return [p for p, r in self.partitions.items() if r.status == "published"]

    @property
    def failed(self) -> list[int]:
        return [p for p, r in self.partitions.items() if r.status == "failed"]

    def summary(self) -> str:
        lines = [r.line() for _, r in sorted(self.partitions.items())]
        records = sum(r.changelog_records for r in self.partitions.values())
        lines.append(
            f"compaction: {len(self.published)} published, {len(self.failed)} failed, "
            f"{len(self.partitions) - len(self.published) - len(self.failed)} skipped; {records} changelog "
            f"records in {self.seconds:.1f}s"
        )
        return "\n".join(lines)
