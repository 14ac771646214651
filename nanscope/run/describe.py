"""The run header of a trace-steps run (`report.run`): what was run, with which data, loss, optimizer, precision and
distribution; and the notes that say how the run was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.data import inputs
from nanscope.engine.distributed import DistributedStep
from nanscope.model.learning_rate import LearningRateView
from nanscope.model.optimizers import optimizer_settings
from nanscope.report.header import run_header
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.guard.options import GuardOptions
    from nanscope.guard.trace_sentinel import TraceSentinel
    from nanscope.engine.step import InstrumentedStep
    from nanscope.run.session import Session
    from nanscope.spec.sections import RunSpec

DEFAULT_RUNS_DIR = Path("nanscope-runs")
# Shorter runs take one compiled call per step instead of chunks of steps (engine/chunk.py):
# tracing and optimising the chunked loop costs about 0.05 s more than the single step,
# and a chunk saves about 0.13 ms a step, so it pays from roughly 500 steps on
# (2-vCPU CPU, configs/exploding-regression.yaml at 200-800 steps; bench/README.md).
CHUNK_MIN_STEPS = 500
STOPPED_BEFORE_TRAINING = "interrupted during start-up (loading the spec, the data or the model): no step ran"


def describe_run(session: Session, engine: InstrumentedStep, learning_rate: LearningRateView | None = None
                 ) -> dict[str, Any]:
    """The run header: what was run, for the report and the trace (`learning_rate`: the optimizer's
    LearningRateView, which adds the schedule under one)."""
    spec = session.spec
    optimizer_name, optimizer_config = optimizer_settings(engine.optimizer)
    return run_header(
        spec=spec.source,
        model=session.model.description,
        model_kind=session.model.kind,
        parameters=session.model.param_count,
        data=session.train.description,
        train_rows=session.train.rows,
        validation_rows=session.validation.rows if session.validation is not None else 0,
        input_shape=inputs.row_shapes(session.train.x),
        batch_size=spec.data.batch_size,
        shuffle=spec.data.shuffle,
        loss=session.loss.name,
        outputs=_outputs(session),
        optimizer=optimizer_name,
        optimizer_config=optimizer_config,
        **(learning_rate.header_fields() if learning_rate is not None else {}),
        steps_requested=spec.train.steps,
        seed=spec.train.seed,
        jit_compile=spec.train.jit_compile,
        mixed_precision=spec.train.mixed_precision,
        loss_scaling=engine.loss_scaled,
        layer_dtypes={info.name: info.dtype for info in engine.layer_info},
        **_distribution(engine),
    )


def _outputs(session: Session) -> list[dict[str, Any]]:
    """Per model output: its name, its loss and the loss's weight in the total."""
    if session.loss.multi_output:
        return [{"name": o.name, "loss": o.loss.name, "weight": o.weight} for o in session.loss.outputs]
    return [{"name": name, "loss": session.loss.name, "weight": 1.0} for name in session.output_names[:1]]


def _distribution(engine: InstrumentedStep) -> dict[str, Any]:
    """The `distribute` entry of the run header under tf.distribute (strategy and replicas); nothing on one device."""
    if not isinstance(engine, DistributedStep):
        return {}
    strategy = engine.strategy
    tf, _ = tensorflow()
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # its class is CollectiveAllReduceStrategy
        return {"distribute": {"strategy": "MultiWorkerMirroredStrategy", "replicas": strategy.num_replicas_in_sync,
                               "workers": engine.workers, "replicas_per_worker": engine.local_replicas}}
    described = {"strategy": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync}
    return {"distribute": described}


def run_notes(spec: RunSpec) -> list[str]:
    """What the report should say about how the run was made."""
    notes: list[str] = []
    if not spec.train.jit_compile:
        notes.append("the traced step runs without XLA (jit_compile: false) so every layer output can be probed")
    if spec.train.distribute == "multi_worker":
        notes.append("train.distribute: multi_worker: each worker takes its part of the batch and its replicas split "
                     "it; the forensic replay of a non-finite step runs on the chief, eagerly on one device, over the "
                     "part of the batch of the first worker that saw the value, without the strategy")
    elif spec.train.distribute:
        notes.append("train.distribute: the batch is split over the replicas; the forensic replay of a non-finite "
                     "step runs eagerly on one device over the whole batch, without the strategy")
    return notes


def sentinel_notes(guard_options: GuardOptions | None, sentinel: TraceSentinel | None) -> list[str]:
    """What the report says of `--mode sentinel` where the run cannot take it (tf.distribute)."""
    if guard_options is None or guard_options.mode != "sentinel" or sentinel is not None:
        return []
    return ["mode=sentinel: not under train.distribute; every step was recorded in full"]
