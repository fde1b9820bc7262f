"""The reference: `app.process` run offline over the input, one fresh state per input partition, no Kafka.

It is what the run should have produced. A record whose processing fails offline (decode or `process` raises)
needs a dead letter instead of outputs; one that `process` rejects (`Reject`) needs a dead letter of that error type.
An App with timers has them fired by the same rule as the runtime's (pipeline/testing/oracle/timers.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from pipeline.app import App, Output, Reject
from pipeline.core.provenance import TimerSource
from pipeline.state.store import PartitionState
from pipeline.state.timed import TimedState
from pipeline.testing.oracle.records import Coord, ExpectedOutput, KafkaRecord
from pipeline.testing.oracle.timers import Firings, new_state


@dataclass
class Reference:
    """The offline fold of the input: outputs per successfully processed coordinate (possibly none), the
    coordinates whose processing fails (they need a dead letter), the final encoded state per input partition."""

    outputs: dict[Coord, list[ExpectedOutput]] = field(default_factory=dict)
    failures: dict[Coord, str] = field(default_factory=dict)
    states: dict[int, dict[str, bytes]] = field(default_factory=dict)
    outputs_to_other_topics: int = 0
    rejections: dict[Coord, str] = field(default_factory=dict)  # coordinate -> the Reject's error type
    timers: Firings | None = None  # the timer firings, for an App with timers

    def expected_count(self, coord: Coord) -> int:
        return len(self.outputs.get(coord, ()))


def fold_reference(
    app: App,
    inputs: Iterable[KafkaRecord],
    *,
    input_topic: str,
    output_topic: str,
    skip: Collection[Coord] = (),
    wall_firings: Iterable[TimerSource] = (),
) -> Reference:
    """Runs app.process offline over each input partition in offset order, with a fresh state per partition.
    `skip`: coordinates that went to the dead letters in the run, left out as the runner left them out.
    `wall_firings`: where the run fired wall-clock timers (from its outputs' eos.timer headers)."""
    reference = Reference()
    firings = reference.timers = (
        Firings(app, lambda out: encode_output(app, out), output_topic, wall_firings) if app.timed else None
    )
    states: dict[int, PartitionState] = {}
    for record in sorted(inputs, key=lambda r: r.coord):
        state = states.get(record.partition)
        if state is None:
            state = states[record.partition] = new_state(app)
        if firings is not None:
            assert isinstance(state, TimedState)  # a timed App's state (new_state)
            firings.before_record(state, record)
        if record.coord not in skip:
            _fold_one(app, state, record, input_topic, output_topic, reference)
    if firings is not None:
        for p, state in states.items():
            assert isinstance(state, TimedState)
            firings.walls_until(state, p, None)
    reference.states = {p: dict(state.encoded_items()) for p, state in states.items()}
    return reference


def _fold_one(
    app: App, state: PartitionState, record: KafkaRecord, input_topic: str, output_topic: str, reference: Reference
) -> None:
    try:
        decoded = app.decode(
            record.key, record.value, input_topic, record.partition, record.offset, record.timestamp_ms, record.headers
        )
    except Exception as e:
        reference.failures[record.coord] = f"decode: {type(e).__name__}: {e}"
        return
    state.begin_record()
    try:
        outputs = list(app.process(state, decoded))
        expected = [encode_output(app, out) for out in outputs if out.topic in (None, output_topic)]
    except Exception as e:
        state.undo_record()
        reference.failures[record.coord] = f"process: {type(e).__name__}: {e}"
        if isinstance(e, Reject):
            reference.rejections[record.coord] = e.error_type
        return
    state.commit()  # keeps the undo logs small; the reference has no transactions
    reference.outputs[record.coord] = expected
    reference.outputs_to_other_topics += len(outputs) - len(expected)


def encode_output(app: App, output: Output) -> ExpectedOutput:
    return ExpectedOutput(
        key=app.output_key_serde.serialize(output.key),
        value=app.output_value_serde.serialize(output.value),
        partition=output.partition,
    )
