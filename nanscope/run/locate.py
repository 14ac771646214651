"""The first non-finite step of a trace-steps run (or a replayed one), located: its phase, layer or variable, then
the op, its inputs and the user's source line behind it (the eager forensic replay), and a repro saved on request.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.run.attribution import StepNames, attribute_from_record, describe_bad_batch
from nanscope.data import targets
from nanscope.engine.distributed import DistributedStep
from nanscope.engine.records import first_nonfinite_worker
from nanscope.spec.options import TraceOptions

if TYPE_CHECKING:
    from nanscope.data.targets import Arrays
    from nanscope.engine.records import StepRecord
    from nanscope.engine.step import InstrumentedStep
    from nanscope.report.model import FirstNonfinite
    from nanscope.run.session import Session

DEFAULT_RUNS_DIR = Path("nanscope-runs")
# Shorter runs take one compiled call per step instead of chunks of steps (engine/chunk.py):
# tracing and optimising the chunked loop costs about 0.05 s more than the single step,
# and a chunk saves about 0.13 ms a step, so it pays from roughly 500 steps on
# (2-vCPU CPU, configs/exploding-regression.yaml at 200-800 steps; bench/README.md).
CHUNK_MIN_STEPS = 500
STOPPED_BEFORE_TRAINING = "interrupted during start-up (loading the spec, the data or the model): no step ran"


def locate_first_nonfinite(record: StepRecord, engine: InstrumentedStep, session: Session, x: Arrays, y: Arrays,
                           options: TraceOptions | None = None) -> FirstNonfinite:
    """Attribute a non-finite step to its phase, its producing layer and op, and the user line behind it.

    The compiled record names the phase and the first layer or variable that shows
    the value; an eager forensic replay of this one step (`nanscope.forensics`) then
    names the op that produced it, its inputs and its source line.
    """
    x, y, rows, part = _worker_part(record, engine, session, x, y)
    first = _attribute(record, engine, session, x, y, rows)
    options = options or TraceOptions()
    state_before = None
    if first.phase != "data" and options.forensics:
        from nanscope.forensics import describe_event, localize_step

        found = localize_step(engine, x, y)
        if part:
            first.detail.append(f"the forensic replay ran on the chief over {part}")
        describe_event(first, found.event, first.phase, loss_name=_loss_of(engine.loss, first.output))
        first.detail.append(f"forensic replay of step {record.step}: {found.seconds:.3f} s")
        state_before = found.state_before
    if options.save_repro is not None:
        from nanscope.forensics import save_repro
        from nanscope.forensics.replay import state_before_step

        save_repro(options.save_repro, session, record.step, x, y, state_before or state_before_step(engine))
        first.detail.append(f"repro saved: nanscope replay {options.save_repro}")
    return first


def step_names(engine: InstrumentedStep) -> StepNames:
    """The StepNames of an instrumented step: its layers, their call order, its variables, the model's outputs."""
    return StepNames(layers=[(info.name, info.cls) for info in engine.layer_info], call_order=engine.layer_call_order,
                     variables=engine.variable_names, outputs=[o.name for o in engine.loss.outputs])


def _worker_part(record: StepRecord, engine: InstrumentedStep, session: Session, x: Arrays, y: Arrays
                 ) -> tuple[Arrays, Arrays, Any, str | None]:
    """(x, y, dataset rows, description) of the part of the batch that the first worker with a non-finite count
    trained on; the whole batch (description None) unless several workers trained."""
    rows = session.order.indices(record.step)
    worker = first_nonfinite_worker(record)
    if worker is None or not isinstance(engine, DistributedStep):  # workers are counted across a cluster only
        return x, y, rows, None
    start, end = engine.worker_rows(len(rows), worker)
    part = slice(start, end)
    described = f"worker {worker}'s part of the batch (batch rows {start}-{end - 1})"
    return targets.take(x, part), targets.take(y, part), rows[part], described


def _attribute(record: StepRecord, engine: InstrumentedStep, session: Session, x: Arrays, y: Arrays,
               rows: Any = None) -> FirstNonfinite:
    first = attribute_from_record(record, step_names(engine))
    if first.phase == "data":
        rows = session.order.indices(record.step) if rows is None else rows
        first.detail = describe_bad_batch(x, y, rows, session.train.feature_names,
                                          session.train.target_names, [o.name for o in engine.loss.outputs])
    return first


def _loss_of(loss: Any, output: str | None) -> str:
    """The loss of output `output` of a multi-output model ("kind: sparse_categorical_crossentropy"), or the loss."""
    named = next((o for o in loss.outputs if o.name == output), None)
    return f"{named.loss.name} of output {named.name!r}" if named else loss.name
