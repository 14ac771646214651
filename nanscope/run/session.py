"""A training session: the spec's data, model, loss and optimizer, built once, seeded.

`open_session(spec)` does everything a run needs before its first step, in the
same order every time, so the same seed gives the same initial weights and the same
batch order. trace-steps, the fix verification and compare-clipping all start
from a `Session`; `Session.reset_weights()` puts the initial weights back for another
run with other optimizer settings.

With `train.distribute: mirrored` the session holds a MirroredStrategy: the model
and every optimizer are created under its scope, and `instrumented_step` returns a
`DistributedStep` (nanscope/engine/distributed.py); otherwise nothing changes. With
`multi_worker` it holds a MultiWorkerMirroredStrategy, created before anything else
starts TensorFlow, and the `Cluster` it spans (nanscope/engine/cluster.py).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nanscope.data import inputs, targets
from nanscope.data.batches import BatchOrder, batch
from nanscope.run.sources import LoadedData, load_data, split_validation
from nanscope.engine.cluster import bounded
from nanscope.engine.chunk import CHUNK_STEPS, ChunkFailure, ChunkRunner, fits_on_device
from nanscope.model.models import build_model
from nanscope.engine.step import InstrumentedStep
from nanscope.engine.model_view import is_loss_scale_optimizer
from nanscope.run.environment import distribution_strategy, dtype_policy, start_up_failures
from nanscope.run.losses import Loss, check_labels_fit, resolve_loss
from nanscope.model.models import LoadedModel, load_model, output_names
from nanscope.model.optimizers import build_optimizer
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.data.targets import Arrays
    from nanscope.engine.cluster import Cluster
    from nanscope.engine.records import StepRecord
    from nanscope.tf_types import GradTransform
    from nanscope.spec.sections import RunSpec


@dataclass
class Session:
    """Everything a run needs, built from one spec.

    Args:
        spec: RunSpec.
        train: LoadedData. The training rows.
        validation: LoadedData or None. The held-out rows.
        order: BatchOrder. Which rows each step draws.
        model: LoadedModel.
        loss: Loss.
        unsafe: bool. Whether `.keras` files may be loaded without safe mode.
        strategy: tf.distribute.Strategy or None. Set by `train.distribute`.
        cluster: Cluster or None. Under `train.distribute: multi_worker`, the workers and this one's task.
        output_names: list of str. The model's outputs, flattened (one name for a single output).
    """

    spec: RunSpec
    train: LoadedData
    validation: LoadedData | None
    order: BatchOrder
    model: LoadedModel
    loss: Loss
    initial_weights: list[np.ndarray]
    unsafe: bool = False
    strategy: Any = None
    output_names: list[str] = field(default_factory=list)
    cluster: Cluster | None = None

    def batch(self, step: int) -> tuple[Arrays, Arrays]:
        """(x, y) of the batch drawn at `step`."""
        return batch(self.train, self.order, step)

    @property
    def scales_loss(self) -> bool:
        """True when training wraps the optimizer in a LossScaleOptimizer (the `mixed_float16` policy, as
        `model.compile` does)."""
        return self.spec.train.mixed_precision == "mixed_float16"

    def instrumented_step(self, optimizer_overrides: dict[str, Any] | None = None,
                          grad_transform: GradTransform | None = None, model: LoadedModel | None = None,
                          loss_scaling: bool | None = None) -> InstrumentedStep:
        """A compiled InstrumentedStep for `model` (default: this session's) with a fresh optimizer.

        `loss_scaling` wraps the optimizer in Keras' LossScaleOptimizer; by default it is
        on under the `mixed_float16` policy, as `model.compile` does.
        """
        _, keras = tensorflow()
        model = model or self.model
        if self.strategy is not None:
            return self._distributed_step(model, optimizer_overrides, grad_transform)
        optimizer = build_optimizer(self.spec, model, optimizer_overrides)
        if loss_scaling is None:
            loss_scaling = self.scales_loss
        if loss_scaling and not is_loss_scale_optimizer(optimizer):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        x, y = self.batch(0)
        return InstrumentedStep(
            model, self.loss, optimizer, x, y, jit_compile=self.spec.train.jit_compile, grad_transform=grad_transform,
            source=self.spec.source,
        )

    def _distributed_step(self, model: LoadedModel, optimizer_overrides: dict[str, Any] | None,
                          grad_transform: GradTransform | None) -> InstrumentedStep:
        from nanscope.engine.distributed import DistributedStep

        with self.strategy.scope():
            optimizer = build_optimizer(self.spec, model, optimizer_overrides)
        x, y = self.batch(0)
        workers = len(self.cluster.workers) if self.cluster is not None else 1
        return DistributedStep(self.strategy, model, self.loss, optimizer, x, y, grad_transform=grad_transform,
                               source=self.spec.source, workers=workers)

    def next_records(self, engine: Runs, runner: ChunkRunner | None, step: int, total: int,
                     stop_on_nonfinite: bool) -> tuple[list[StepRecord], BaseException | None]:
        """(records, None) of the next step, or of the next chunk of steps when `runner` is set.

        When a TensorFlow op fails inside a step, returns the records of the steps
        finished before it and the error instead of raising.
        """
        if runner is None:
            x, y = self.batch(step)
            try:
                with bounded(self.cluster):
                    return [engine.run(step, x, y)], None
            except Exception as exc:
                return [], exc
        steps = self.order.uniform_run(step, min(total, step + CHUNK_STEPS))
        try:
            return runner.run(step, [self.order.indices(s) for s in steps], stop_on_nonfinite), None
        except ChunkFailure as failure:
            return failure.records, failure.error

    def chunk_runner(self, engine: InstrumentedStep, expected: Collection[int] = ()) -> ChunkRunner | None:
        """A ChunkRunner for `engine` when the training arrays fit on the device, else None (one call per step).

        `expected`: indices of layers whose non-finite outputs are intended; they do not end a chunk.
        """
        if not getattr(engine, "chunkable", False) or not fits_on_device(self.train.x, self.train.y):
            return None
        return ChunkRunner(engine, self.train.x, self.train.y, expected)

    @contextlib.contextmanager
    def using_data(self, change: Callable[[LoadedData], LoadedData] | None = None) -> Iterator[Session]:
        """Train on `change(train)` and validate on `change(validation)` inside the block; None changes nothing."""
        if change is None:
            yield self
            return
        kept = self.train, self.validation
        self.train = change(self.train)
        self.validation = change(self.validation) if self.validation is not None else None
        try:
            yield self
        finally:
            self.train, self.validation = kept

    def reset_weights(self, model: LoadedModel | None = None) -> None:
        """Put the model's variables back to their initial values (same seed, same start)."""
        model = model or self.model
        for variable, value in zip(_state_variables(model), self.initial_weights):
            variable.assign(value)

    def initial_weight_norm(self) -> float:
        """The L2 norm of the trainable weights before the first step (from the initial values kept)."""
        trainable = {id(v) for v in self.model.trainable_variables}
        squares = [float(np.sum(np.square(value, dtype=np.float64)))
                   for variable, value in zip(_state_variables(self.model), self.initial_weights)
                   if id(variable) in trainable]
        return math.sqrt(sum(squares))

    def evaluate(self, step_engine: InstrumentedStep, data: LoadedData | None = None) -> float | None:
        """Mean data loss of `data` (default: the validation rows) under the step's current weights, or None."""
        data = data if data is not None else self.validation
        if data is None:
            return None
        return evaluate_loss(step_engine, data, self.order.batch_size)


def open_session(spec: RunSpec, unsafe: bool = False) -> Session:
    """Load data, model and loss for `spec`, seeding everything from `train.seed`.

    Under `multi_worker`, a collective that fails while the model is built (a worker that
    left) raises ClusterError, exit 2.
    """
    strategy, cluster = distribution_strategy(spec)  # a multi-worker strategy must come before TensorFlow starts
    _, keras = tensorflow()
    keras.utils.set_random_seed(spec.train.seed)
    loaded = load_data(spec)
    train, validation = split_validation(loaded, spec.data.validation.fraction)
    order = BatchOrder(train.rows, spec.data.batch_size, spec.data.shuffle, spec.train.seed)
    keras.utils.set_random_seed(spec.train.seed)
    with start_up_failures(cluster), dtype_policy(spec.train.mixed_precision), \
            strategy.scope() if strategy else contextlib.nullcontext():
        model = load_model(spec, unsafe=unsafe)
        output = build_model(model, batch(train, order, 0)[0], source=spec.source)
        names = output_names(model, output)
        loss = resolve_loss(spec, model, names)
    loaded.y = targets.arrange(loaded.y, names, f"{spec.source}: data")
    for part in (train, validation):
        if part is not None:
            part.y = targets.arrange(part.y, names, f"{spec.source}: data")
    check_labels_fit(spec, loss, output, loaded.y)
    initial = [v.numpy() for v in _state_variables(model)]
    return Session(spec, train, validation, order, model, loss, initial, unsafe, strategy, names, cluster)


def _state_variables(model: LoadedModel) -> list[Any]:
    return list(model.keras_model.variables) if model.keras_model is not None else list(model.variables)


class Runs(Protocol):
    """What runs one step: an InstrumentedStep, or the sentinel that stands in for it (guard.trace_sentinel)."""

    def run(self, step: int, x: Arrays, y: Arrays) -> StepRecord: ...


class Rows(Protocol):
    """Rows to evaluate the loss on: a LoadedData, or one batch of it (run.proven_fix)."""

    @property
    def x(self) -> Arrays: ...

    @property
    def y(self) -> Arrays: ...

    @property
    def rows(self) -> int: ...


# Each step engine's compiled evaluation, made on its first evaluate_loss and gone with the engine.
_EVALUATORS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def evaluate_loss(step_engine: InstrumentedStep, data: Rows, batch_size: int) -> float | None:
    """Row-weighted mean of the loss over `data`, in inference mode, compiled once per engine."""
    tf, _ = tensorflow()
    fn = _EVALUATORS.get(step_engine)
    if fn is None:
        model, loss = step_engine.model, step_engine.loss

        @tf.function(autograph=False, reduce_retracing=True)
        def compiled(x: Any, y: Any) -> Any:
            return loss.total(loss.terms(y, model.call(x, training=False)))

        fn = _EVALUATORS[step_engine] = compiled
    total, rows = 0.0, 0
    for start in range(0, data.rows, batch_size):
        part = slice(start, start + batch_size)
        x, y = targets.take(data.x, part), targets.take(data.y, part)
        count = inputs.rows(x)  # not len(x): a mapping of inputs has as many keys as inputs
        total += float(fn(x, y)) * count
        rows += count
    return total / rows if rows else None


__all__ = ["Loss", "Session", "evaluate_loss", "open_session"]
