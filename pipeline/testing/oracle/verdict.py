"""The verdict: per category of damage, how many problems were found and the first few, as text or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from pipeline.testing.oracle.records import Coord, KafkaRecord

SAMPLE_LIMIT = 20
CATEGORIES = ("duplicates", "losses", "order", "content", "state", "offsets", "app")


@dataclass(frozen=True)
class Problem:
    where: str  # "0:17" (an input coordinate), "out 1@42", "state p0 'acct-3'", "committed p0", ...
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.detail}"


@dataclass
class Findings:
    """Problems of one category: the count of all of them and the first SAMPLE_LIMIT."""

    count: int = 0
    samples: list[Problem] = field(default_factory=list)

    def add(self, where: str, detail: str) -> None:
        self.count += 1
        if len(self.samples) < SAMPLE_LIMIT:
            self.samples.append(Problem(where, detail))


@dataclass
class Verdict:
    inputs: int
    outputs: int
    dead_letters: int
    changelog_records: int
    duplicates: Findings = field(default_factory=Findings)
    losses: Findings = field(default_factory=Findings)
    order: Findings = field(default_factory=Findings)
    content: Findings = field(default_factory=Findings)
    state: Findings = field(default_factory=Findings)
    offsets: Findings = field(default_factory=Findings)
    app: Findings = field(default_factory=Findings)  # the App's own properties (App.check), where it has some
    notes: list[str] = field(default_factory=list)
    # The drained output, for observer_subset_of_final; not part of the verdict's JSON.
    final_outputs: list[KafkaRecord] = field(default_factory=list, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return all(self.findings(category).count == 0 for category in CATEGORIES)

    def findings(self, category: str) -> Findings:
        findings: Findings = getattr(self, category)  # one of CATEGORIES: a Findings field
        return findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": {
                "inputs": self.inputs,
                "outputs": self.outputs,
                "dead_letters": self.dead_letters,
                "changelog_records": self.changelog_records,
            },
            "problems": {category: asdict(self.findings(category)) for category in CATEGORIES},
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return orjson.dumps(self.as_dict(), option=orjson.OPT_INDENT_2).decode()

    def summary(self) -> str:
        lines = [
            f"exactly-once: {'OK' if self.ok else 'FAILED'}  (inputs {self.inputs}, outputs {self.outputs}, "
            f"dead letters {self.dead_letters}, changelog records {self.changelog_records})",
            f"  {'check':<11} {'problems':>8}  first",
        ]
        for category in CATEGORIES:
            found = self.findings(category)
            first = str(found.samples[0]) if found.samples else ""
            lines.append(f"  {category:<11} {found.count:>8}  {clip(first, 90)}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def coord_name(coord: Coord) -> str:
    """An input coordinate as problems name it: "partition:offset", "partition:offset/input" for a record of another
    than the first input."""
    return f"{coord[0]}:{coord[1]}" + (f"/{coord[2]}" if len(coord) > 2 else "")


def clip(data: object, limit: int = 60) -> str:
    text = data if isinstance(data, str) else repr(data)
    return text if len(text) <= limit else text[: limit - 3] + "..."
