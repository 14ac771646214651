"""The instrumented train step: one compiled function, small reduced outputs.

`InstrumentedStep` compiles forward, loss, backward and the optimizer update into
one `tf.function` that returns a few small tensors: scalars (loss, global gradient
norm, non-finite counts per phase), a row per layer and a row per variable. Nothing
per-element crosses into Python on a healthy step.

Before each update the step copies the model's weights into snapshot variables
(one extra copy, on the device). After a non-finite step that copy restores the
weights as they were before the step, so the step's forward and backward pass can be
replayed exactly (engine/step_state.py; the optimizer's slots are copied only under the
guard, to undo a skipped step whole). |dw| is the norm of the
increments the optimizer wrote (`flat.applied_updates`), or where it wrote otherwise
(a constraint, a conditional update), of the weights after the step less the copy.

The optimizer gets the gradients as handed (`as_handed`): Keras' own sum of the replicas'
gradients is skipped. On one replica that sum is the gradients themselves, but Keras runs it
through the replica context's all-reduce even without a strategy, and that all-reduce, traced,
registers a gradient function in TensorFlow's global registry which holds the traced graph
for the life of the process: every trace (a replay, a fix tried, a retrace) kept its graph.
"""

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol


from nanscope.data import inputs
from nanscope.data.targets import Arrays
from nanscope.engine.failures import model_outputs, raised_while_tracing
from nanscope.engine.step_scalars import StepTensors, scalar_row
from nanscope.engine.step_state import StepState
from nanscope.engine.variable_stats import (any_nonfinite_count, applied_updates, float32, global_norm,
                                            graph_position, summary_stats, variable_rows)
from nanscope.model.models import LoadedModel, build_model
from nanscope.engine.probes import LayerRecorder
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import VARIABLE, StepLayout
from nanscope.errors import ModelError
from nanscope.internals import overridden
from nanscope.runtime import tensorflow
from nanscope.tf_types import GradTransform, Optimizer, Tensor
from nanscope.engine.model_view import (LayerInfo, is_loss_scale_optimizer, keras_gradients, keras_sum_skipped,
                                         layer_loss_terms, one_replica, probed_layers, relative_variable_names)

# What `_train` hands the statistics: y_pred, total, data_loss, grads, applied, scale, output_losses, updates.
Trained = tuple[Any, Tensor, Tensor, list[Tensor], list[Tensor], Tensor | None, list[Tensor], list[Tensor | None]]


class StepLoss(Protocol):
    """The loss a step minimises (run.losses.Loss, a layer up): one term per output, and their weighted sum."""

    @property
    def outputs(self) -> Sequence[Any]: ...

    @property
    def multi_output(self) -> bool: ...

    def terms(self, y: Any, y_pred: Any) -> list[Tensor]: ...

    def total(self, terms: list[Tensor]) -> Tensor: ...


class InstrumentedStep:
    """A compiled, instrumented train step for one model, loss and optimizer.

    Args:
        model: LoadedModel.
        loss: losses.Loss.
        optimizer: keras.Optimizer. Built here on the model's trainable variables.
        sample_x: np.ndarray. A batch of inputs, used for shapes and to build the model (a mapping or a
            tuple of arrays, one per input, for a model with several inputs).
        sample_y: np.ndarray. The matching targets (a tuple of arrays, one per output, for a
            multi-output Loss).
        jit_compile: bool, default False. Compile the step with XLA.
        grad_transform: callable(list of grads) -> list of grads, optional. Applied
            between the backward pass and the optimizer (manual clipping strategies).
        source: str, optional. The spec file, named in errors.

    Example:
        step = InstrumentedStep(model, loss, optimizer, x[:32], y[:32])
        record = step.run(0, x[:32], y[:32])
    """

    # `_step` can run inside a `tf.while_loop` over device-resident data (engine/chunk.py).
    chunkable = True
    # `run_light` (the sentinel's step) trains as `run` does.
    runs_light = True

    def __init__(self, model: LoadedModel, loss: StepLoss, optimizer: Optimizer, sample_x: Arrays, sample_y: Arrays,
                 jit_compile: bool = False, grad_transform: GradTransform | None = None,
                 source: str | None = None) -> None:
        tf, _ = tensorflow()
        self.source = source
        self.model = model
        self.loss = loss
        self.optimizer = optimizer
        self.jit_compile = jit_compile
        self.grad_transform = grad_transform
        build_model(model, sample_x)
        self.layers = probed_layers(model.keras_model)
        self.layer_info = [
            LayerInfo(layer.name, type(layer).__name__, str(getattr(layer, "compute_dtype", "float32")))
            for layer in self.layers
        ]
        self.loss_scaled = is_loss_scale_optimizer(optimizer)
        self.trainable = list(model.keras_model.trainable_variables if model.keras_model is not None
                              else model.trainable_variables)
        if not self.trainable:
            raise ModelError(f"{self._where('model')}the model has no trainable variables, so there is nothing to "
                             "train or trace", hint="was it frozen with `trainable = False`?")
        self.variable_names = relative_variable_names(self.trainable, model.keras_model)
        self.optimizer.build(self.trainable)
        # The optimizer's own sum of the replicas' gradients, replaced by the gradients as handed.
        self._keras_sum_skipped = keras_sum_skipped(optimizer)
        self.state = StepState(self._model_state())  # the guard adds the optimizer's: `keep_optimizer_state`
        self._recorder = LayerRecorder(self.layers)
        x_spec, y_spec = (tf.nest.map_structure(lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)), s)
                          for s in (sample_x, sample_y))
        self._compiled = tf.function(self._step, input_signature=[x_spec, y_spec], jit_compile=jit_compile,
                                     autograph=False)
        self._concrete: Any = None  # traced on first use: a chunked run never calls the single step
        self._light: Any = None  # the sentinel's step (`run_light`), traced on first use
        self.generation = 0  # how many times `retrace` was called: a ChunkRunner traces its loop again after one

    @property
    def layout(self) -> StepLayout:
        """The StepLayout of this step's outputs (engine/schema.py)."""
        return StepLayout(outputs=len(self.loss.outputs), layers=len(self.layers),
                          terms=len(self.layers) + 1 if self.model.keras_model is not None else 0,
                          variables=len(self.trainable))

    @property
    def layer_call_order(self) -> list[str]:
        """Probed layer names in execution order, as seen when a step was traced."""
        if not self._recorder.traced:
            self._traced()
        return [self.layer_info[i].name for i in self._recorder.call_order]

    def _traced(self) -> Any:
        """The single-step concrete function, traced (with the layer probes attached) on first use."""
        if self._concrete is None:
            with self._recorder.attached():
                self._concrete = self._compiled.get_concrete_function()
        return self._concrete

    def probes_attached(self) -> contextlib.AbstractContextManager[LayerRecorder]:
        """A block in which a trace of the step records every probed layer (engine/chunk.py traces its loop so)."""
        return self._recorder.attached()

    def step_outputs(self, x: Any, y: Any) -> tuple[Tensor, ...]:
        """The step's output tensors (scalars, layer statistics, loss terms, variable statistics), for a caller
        that traces the step inside its own graph (engine/chunk.py's loop over device-resident batches)."""
        return self._step(x, y)

    def _model_state(self) -> list[Any]:
        if self.model.keras_model is None:
            return list(self.trainable) + self._loss_scale_state()
        others = [v for v in self.model.keras_model.variables if all(v is not t for t in self.trainable)]
        return list(self.trainable) + others + self._loss_scale_state()

    def _loss_scale_state(self) -> list[Any]:
        # A LossScaleOptimizer's scale and growth counter (two scalars) are kept with the weights: the replay of a
        # step, and its repro, must run under the scale the step's loss was scaled by, not the one it left.
        return [self.optimizer.step_counter, self.optimizer.dynamic_scale] if self.loss_scaled else []

    def _where(self, field: str) -> str:
        return (f"{self.source}: " if self.source else "") + f"{field}: "

    def raised_by(self, field: str) -> contextlib.AbstractContextManager[None]:
        """A context that reports an exception raised while the step is traced as bad input in `field`."""
        return raised_while_tracing(self._where(field))

    def predictions(self, y_pred: Any) -> Any:
        """The model's output, checked (`failures.model_outputs`)."""
        return model_outputs(y_pred, self._where("model"))

    def _step(self, x: Any, y: Any) -> tuple[Tensor, ...]:
        self._recorder.begin()
        return self._outputs(x, y, *self._train(x, y))

    def _light_step(self, x: Any, y: Any) -> tuple[Tensor, Tensor]:
        """The sentinel's step: the same training without the layer probes or the per-variable rows; only the
        scalars, with the gradients and weights reduced over all variables at once (`summary_stats`)."""
        tf, _ = tensorflow()
        y_pred, total, data_loss, grads, applied, scale, output_losses, updates = self._train(x, y)
        measured, weight_norm = summary_stats(grads, self.trainable, None if applied is grads else applied)
        scalars = self._scalars(x, y, y_pred, total, data_loss, applied, scale, output_losses, measured)
        # |w| and |dw| over all weights, for the rules that read every step's (the update ratio, the weights' growth).
        changes = [float32(v) - float32(c) if d is None else float32(d)
                   for d, v, c in zip(updates, self.trainable, self.state.model.copies)]
        return scalars, tf.stack([weight_norm, global_norm(changes)])

    def _train(self, x: Any, y: Any) -> Trained:
        """Copy the state, then forward, loss, backward and the update, in the graph being traced; the tensors the
        statistics are taken of."""
        tf, _ = tensorflow()
        self._take_snapshots()
        with tf.GradientTape() as tape:
            with self.raised_by("model"):
                y_pred = self.predictions(self.model.call(x, training=True))
            with self.raised_by("train.loss"):
                output_losses = self.loss.terms(y, y_pred)
                data_loss = self.loss.total(output_losses)
            terms = self._layer_loss_terms()
            total = data_loss + (tf.add_n([tf.reduce_sum(t) for t in terms]) if terms else 0.0)
            scale = (tf.cast(tf.convert_to_tensor(self.optimizer.dynamic_scale), tf.float32)
                     if self.loss_scaled else None)
            objective = total * scale if self.loss_scaled else total
        raw = tape.gradient(objective, self.trainable)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(raw, self.trainable)]
        if self.loss_scaled:
            # Statistics and any clipping see true gradients; the LossScaleOptimizer gets
            # scaled ones back and skips the update when they are not finite.
            grads = [g / tf.cast(scale, g.dtype) for g in grads]
        applied = self.grad_transform(grads) if self.grad_transform is not None else grads
        handed = [g * tf.cast(scale, g.dtype) for g in applied] if self.loss_scaled else applied
        if self.grad_transform is None:
            handed = keras_gradients(raw, handed)
        start = graph_position()
        with self.raised_by("train.optimizer"), overridden(self._keras_sum_skipped if one_replica() else []):
            self.optimizer.apply_gradients(zip(handed, self.trainable))
        updates = applied_updates(start, self.trainable)
        return y_pred, total, data_loss, grads, applied, scale, output_losses, updates

    def _take_snapshots(self) -> None:
        """Copy the state before the update, in the graph being traced (`StepState.take`)."""
        self.state.take()

    def _layer_loss_terms(self) -> list[Tensor]:
        self._loss_terms = layer_loss_terms(self.layers, self.model.keras_model)
        return self._loss_terms

    def _outputs(self, x: Any, y: Any, y_pred: Any, total: Tensor, data_loss: Tensor, grads: list[Tensor],
                 applied: list[Tensor], scale: Tensor | None, output_losses: list[Tensor],
                 updates: list[Tensor | None] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        tf, _ = tensorflow()
        var_stats, grad_norm, applied_norm = variable_rows(
            grads, self.state.model.copies[: len(self.trainable)], self.trainable,
            None if applied is grads else applied, updates)
        measured = {"grad_global_norm": grad_norm, "applied_grad_global_norm": applied_norm,
                    "grad_nonfinite": tf.reduce_sum(var_stats[:, VARIABLE.at("grad_nonfinite")]),
                    "weights_nonfinite": tf.reduce_sum(var_stats[:, VARIABLE.at("weight_nonfinite")])}
        scalars = self._scalars(x, y, y_pred, total, data_loss, applied, scale, output_losses, measured)
        layer_terms = tf.stack(self._loss_terms) if self._loss_terms else tf.zeros([0])
        return scalars, self._recorder.stats_matrix(), layer_terms, var_stats

    def _scalars(self, x: Any, y: Any, y_pred: Any, total: Tensor, data_loss: Tensor, applied: list[Tensor],
                 scale: Tensor | None, output_losses: list[Tensor], measured: dict[str, Tensor]) -> Tensor:
        """The step's scalar row (engine/step_scalars.py); `measured`: the gradient and weight columns."""
        scale_after = self.optimizer.dynamic_scale if self.loss_scaled else None
        return scalar_row(StepTensors(x, y, y_pred, total, data_loss, applied, scale, output_losses), measured,
                          scale_after, self.loss.multi_output, self._prediction_nonfinite)

    def _prediction_nonfinite(self, prediction: Tensor) -> Tensor:
        """Non-finite entries of one model output: the count its layer's probe took, where there is one."""
        counted = self._recorder.nonfinite_count(prediction)
        return any_nonfinite_count(prediction) if counted is None else counted

    def run(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        """Run one train step on a batch and return its StepRecord."""
        scalars, layer_stats, layer_terms, var_stats = self._traced()(x, y)
        return StepRecord.from_arrays(step, inputs.rows(x), scalars.numpy(), layer_stats.numpy(), layer_terms.numpy(),
                                      var_stats.numpy())

    def run_light(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        """Run one sentinel step on a batch (`_light_step`): a StepRecord of the scalars, with no layer or
        variable rows. The state before it is copied as before a full step."""
        if self._light is None:
            tf, _ = tensorflow()
            self._light = tf.function(self._light_step, input_signature=self._compiled.input_signature,
                                      jit_compile=self.jit_compile, autograph=False).get_concrete_function()
        scalars, norms = self._light(x, y)
        record = StepRecord.from_arrays(step, inputs.rows(x), scalars.numpy(), [], [], [])
        record.overall_norms = tuple(float(n) for n in norms.numpy())
        return record

    def rerun_in_full(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        """The full StepRecord of the last step, re-run on its batch from the state before it (the optimizer's
        too, after `keep_optimizer_state`); every variable is then left as the step left it."""
        with self.state.kept():
            self.state.restore(optimizer=True)
            return self.run(step, x, y)

    def retrace(self) -> None:
        """Trace the step again at its next run: after a change to an optimizer setting that the traced graph
        reads (clipping, epsilon). A ChunkRunner over this step traces its loop again too (`generation`)."""
        tf, _ = tensorflow()
        self._compiled = tf.function(self._step, input_signature=self._compiled.input_signature,
                                     jit_compile=self.jit_compile, autograph=False)
        self._concrete = self._light = None
        self.generation += 1

    def keep_optimizer_state(self) -> None:
        """Copy the optimizer's variables (its counter, its slots) before each update too, so that
        `state.restore(optimizer=True)` undoes a whole step (the guard's skip). Before the step is traced."""
        self.state.keep_optimizer(self.optimizer.variables)
