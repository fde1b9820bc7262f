"""The oracle: proves (or refutes) that every input record of a run had its effect exactly once, from plain data.

It is independent of the runtime's machinery on purpose: no Kafka client, no runner, task or restore code, only the
App and the record formats (provenance, dead letters, changelog). A bug in the runtime cannot hide itself by also
being in the oracle, and unit tests feed it in-memory runs. Reading Kafka into a RunData is pipeline.testing.drain.

    records.py    KafkaRecord, TopicDump, RunData: what a run left behind, as plain lists
    reference.py  fold_reference: `app.process` run offline over the input (the reference)
    checks.py     the checks, one category each, and `check(app, run)` that runs them all
    offsets.py    the committed offsets and checkpoints
    inputs.py     several inputs and tables: the order each task took their records in, replayed (docs/inputs.md)
    verdict.py    Verdict: per category the count and first problems, as text or JSON

What "correct" means, per input coordinate (partition, offset):
- it was processed offline fine: the output topic holds exactly the reference's outputs with that source, same
  key/value bytes (and partition, where the app chose one); or it went to the dead letters instead, once;
- its processing fails offline (decode or `process` raises): exactly one dead letter, no output;
- in each output partition, the outputs of one input partition appear in increasing input offset;
- the changelog's final state per partition equals the reference's; the group's committed offset and the last
  changelog checkpoint of each input partition point just past its last input record.
A record that did go to the dead letters is left out of the reference fold: a flaky failure may be dead-lettered.
And a concurrent read_committed reader must never have seen an output that the final drain lacks
(`observer_subset_of_final`).
"""

from pipeline.testing.oracle.checks import (
    DeadLetterEntry,
    changelog_states,
    check,
    check_content,
    check_duplicates,
    check_losses,
    check_order,
    check_state,
    compare_states,
    extra_outputs,
    observer_subset_of_final,
    outputs_by_source,
    parse_dead_letters,
)
from pipeline.testing.oracle.offsets import check_next_offset, check_offsets, last_checkpoints
from pipeline.testing.oracle.records import Coord, ExpectedOutput, KafkaRecord, RunData, TopicDump
from pipeline.testing.oracle.reference import Reference, fold_reference
from pipeline.testing.oracle.verdict import CATEGORIES, SAMPLE_LIMIT, Findings, Problem, Verdict

__all__ = [
    "CATEGORIES",
    "SAMPLE_LIMIT",
    "Coord",
    "DeadLetterEntry",
    "ExpectedOutput",
    "Findings",
    "KafkaRecord",
    "Problem",
    "Reference",
    "RunData",
    "TopicDump",
    "Verdict",
    "changelog_states",
    "check",
    "check_content",
    "check_duplicates",
    "check_losses",
    "check_next_offset",
    "check_offsets",
    "check_order",
    "check_state",
    "compare_states",
    "extra_outputs",
    "fold_reference",
    "last_checkpoints",
    "observer_subset_of_final",
    "outputs_by_source",
    "parse_dead_letters",
]
