"""What one traced train step computed, caught from the step's own calls.

Shared by the `NanScope` callback (around Keras' `train_step`) and `instrument`
(around the user's own step). Hooks on each optimizer's `apply` take the gradients as
they reach it and the weights before and after; a hook on `_clip_gradients` takes the
gradients actually applied; inside `fit`, a hook on `model.compute_loss` takes the
loss and the prediction. Under a `LossScaleOptimizer` the gradients arrive scaled: they
are unscaled for the statistics, and the step records whether the optimizer skipped
the update and its scale before and after.

Only tensors of the step's own graph are kept: a call from inside a nested graph
(a `cond` branch under gradient accumulation) cannot hand its tensors out.

Under tf.distribute the statistics are of the whole batch's gradients, summed over the
replicas. Every execution of a cross-replica collective keeps ~1.5 KB in TensorFlow for
good, so the sums are taken from the optimizer's own all-reduce where it summed the very
gradients the statistics are of (no clipping, no scaling in between), and only the rest
are summed here, in one all-reduce, when the row is built.
"""

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeAlias

from nanscope.engine.variable_stats import variable_rows
from nanscope.engine.schema import OUTPUT, SCALARS, VARIABLE
from nanscope.engine.model_view import is_loss_scale_optimizer
from nanscope.internals import all_reduce_gradients_hooks, clip_gradients_hook, overridden
from nanscope.keras.outputs import output_terms
from nanscope.keras.step_terms import count_nonfinite, loss_terms
from nanscope.model.learning_rate import inner_optimizer
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Layer, Optimizer, ReplicaContext, Tensor, Variable

tf, keras = tensorflow()

# A gradient is None for a variable the loss does not reach.
Gradients: TypeAlias = list[Tensor | None]


class StepCapture:
    """Hooks for one trace of a train step, and the statistics row built from what they caught.

    Args:
        model: keras.Model or None. Inside `fit`: the model whose `compute_loss` gives the loss.
        optimizers: list of keras.Optimizer. Their `apply` gives gradients and weights.
        trainable: list of variables, in record order.
        keras_models: list of keras.Model. Whose layer loss terms (add_loss, regularizers) are summed.
        replica_context, replicas: under tf.distribute (fit only), the replica's context and the replica count.
        outputs: int. Outputs of a multi-output model compiled with per-output losses (0: one).
    """

    def __init__(self, model: KerasModel | None, optimizers: Iterable[Optimizer | None], trainable: Sequence[Variable],
                 keras_models: Iterable[KerasModel] = (), replica_context: ReplicaContext | None = None,
                 replicas: int = 1, outputs: int = 0) -> None:
        self.model, self.trainable, self.outputs = model, trainable, outputs
        self.optimizers = [o for o in optimizers if o is not None]
        self.keras_models = list(keras_models) or ([model] if model is not None else [])
        self.replica_context, self.replicas = replica_context, replicas
        self.local_nonfinite = tf.constant(0.0)
        self._thread: threading.local | None = None  # names each replica thread's capture, on the shared hooks
        self.loss: Tensor | None = None
        self.y_pred: Tensor | None = None
        self.applied: Gradients | None = None
        self.scale_before: Tensor | None = None
        self.scale_after: Tensor | None = None
        self.skipped: list[Tensor] = []
        self.grads: dict[int, Tensor] = {}
        self.before: dict[int, Tensor] = {}
        self.after: dict[int, Tensor] = {}
        # Under tf.distribute: what the optimizers were handed, summed in `_sum_replicas` (see the module's doc).
        self._unsummed: list[tuple[Gradients, list[Variable], Tensor | None]] = []  # ([grads], [variables], scale)
        self._clipped: list[list[Tensor]] = []  # [clipped grads]
        self._reduced: dict[int, tuple[Tensor, Tensor]] = {}  # id(gradient) -> (gradient, its sum), optimizers' own
        # What rides on the optimizer's own all-reduce (made when it runs, None: nothing), and its sum.
        self.ride: Callable[[], Tensor | None] | None = None
        self.folded: Tensor | None = None
        self._replica_part: tuple[dict[str, Tensor], list[Tensor]] | None = None
        self.graph = tf.compat.v1.get_default_graph()

    @contextlib.contextmanager
    def attached(self) -> Iterator["StepCapture"]:
        targets: list[tuple[Any, str, Callable[[Any], Any]]] = (
            [(self.model, "compute_loss", self._on_compute_loss)] if self.model is not None else [])
        for optimizer in self.optimizers:
            targets += [(optimizer, "apply", functools.partial(self._on_apply, optimizer)),
                        clip_gradients_hook(inner_optimizer(optimizer), self._on_clip),
                        *all_reduce_gradients_hooks(optimizer, self._on_all_reduce)]
        with overridden(targets):
            yield self

    def shared_by_threads(self) -> "StepCapture":
        """Make this capture the hub of replica threads (under tf.distribute, one trace runs every replica's
        thread in turn through the same hooks): each thread's hook calls then go to the capture it hands over
        with `for_this_thread`. Returns self."""
        self._thread = threading.local()
        return self

    def for_this_thread(self, capture: "StepCapture") -> None:
        """Send the hook calls made on the calling thread to `capture` (that replica's own)."""
        assert self._thread is not None  # only a capture `shared_by_threads` hands its threads over
        self._thread.capture = capture

    def _here(self) -> bool:
        return tf.compat.v1.get_default_graph() is self.graph

    def _active(self) -> "StepCapture":
        """The capture of the calling replica thread (see `StepProbe`), or this one on one device."""
        return getattr(self._thread, "capture", self) if self._thread is not None else self

    def _on_compute_loss(self, compute_loss: Callable[..., Tensor]) -> Callable[..., Tensor]:
        @functools.wraps(compute_loss)
        def hooked(*args: Any, **kwargs: Any) -> Tensor:
            loss = compute_loss(*args, **kwargs)
            c = self._active()
            if c._here():
                c.loss = loss
                c.y_pred = kwargs["y_pred"] if "y_pred" in kwargs else (args[2] if len(args) > 2 else None)
            return loss

        return hooked

    def _on_apply(self, optimizer: Optimizer, apply: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(apply)
        def hooked(grads: Iterable[Tensor | None], trainable_variables: Iterable[Variable] | None = None) -> Any:
            grads = list(grads)
            c = self._active()
            variables = list(trainable_variables) if trainable_variables is not None else list(c.trainable)
            if c._here():
                c._caught(optimizer, grads, variables)
            result = apply(grads, trainable_variables)
            if c._here():
                c.after.update({id(v): tf.convert_to_tensor(v) for v in variables})
                if is_loss_scale_optimizer(optimizer) and c.scale_after is None:
                    c.scale_after = tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale), tf.float32)
            return result

        return hooked

    def _caught(self, optimizer: Optimizer, grads: Gradients, variables: list[Variable]) -> None:
        """Gradients as they reach `optimizer` (unscaled), the weights before, and whether a loss scaler skips."""
        scaled = is_loss_scale_optimizer(optimizer)
        scale = tf.convert_to_tensor(optimizer.dynamic_scale) if scaled else optimizer.loss_scale_factor
        present = [g for g in grads if g is not None]
        if scaled:
            if self.scale_before is None:
                self.scale_before = tf.cast(scale, tf.float32)
            finite = [tf.reduce_all(tf.math.is_finite(g)) for g in present]
            self.skipped.append(tf.logical_not(tf.reduce_all(tf.stack(finite))) if finite else tf.constant(False))
        for v in variables:
            self.before[id(v)] = tf.convert_to_tensor(v)
        if self.replica_context is not None:
            # The replica's own non-finite gradient entries; the sums wait for the optimizer's own all-reduce.
            self.local_nonfinite = count_nonfinite(present)
            self._unsummed.append((grads, variables, scale))
            return
        self._keep_grads(grads, variables, scale)

    def _keep_grads(self, grads: Gradients, variables: Sequence[Variable], scale: Tensor | None) -> None:
        for g, v in zip(grads, variables):
            if g is not None:
                self.grads[id(v)] = g if scale is None else g / tf.cast(scale, g.dtype)

    def _on_clip(self, clip: Callable[[Gradients], Gradients]) -> Callable[[Gradients], Gradients]:
        @functools.wraps(clip)
        def hooked(grads: Gradients) -> Gradients:
            clipped = clip(grads)
            c = self._active()
            if c._here():
                present = [g for g in clipped if g is not None]
                if c.replica_context is not None:
                    c._clipped.append(present)
                else:
                    c.applied = (c.applied or []) + present
            return clipped

        return hooked

    def _on_all_reduce(self, reduce: Callable[[list[tuple[Tensor | None, Variable]]], Any]
                       ) -> Callable[[Iterable[tuple[Tensor | None, Variable]]], Any]:
        @functools.wraps(reduce)
        def hooked(grads_and_vars: Iterable[tuple[Tensor | None, Variable]]) -> Any:
            grads_and_vars = list(grads_and_vars)
            c = self._active()
            mine = c._here() and c.replica_context is not None
            # Under MultiWorkerMirroredStrategy the row's replica part rides along (`RowBuffer.fold`).
            # One all-reduce packs its tensors into one: only with float32 gradients, as the row is.
            alike = all(g.dtype == tf.float32 for g, _ in grads_and_vars if g is not None)
            ride = c.ride() if mine and alike and c.ride is not None and c.folded is None else None
            reduced = list(reduce(grads_and_vars + ([(ride, None)] if ride is not None else [])))
            if ride is not None:
                c.folded = reduced.pop()[0]
            if mine:
                c._reduced.update({id(g): (g, total) for (g, _), (total, _) in zip(grads_and_vars, reduced)
                                   if g is not None})
            return reduced

        return hooked

    def _sum_replicas(self) -> None:
        """Under tf.distribute: the whole batch's gradients (and clipped gradients) for the statistics.

        A gradient the optimizer summed itself takes that sum; the others are summed here, in one all-reduce.
        The optimizer still gets the replica's own gradients, and sums them itself.
        """
        if self.replica_context is None or not (self._unsummed or self._clipped):
            return
        handed = [g for grads, _, _ in self._unsummed for g in grads if g is not None] + [
            g for clipped in self._clipped for g in clipped]
        missing = [g for g in handed if self._reduced.get(id(g), (None,))[0] is not g]
        if missing:
            summed = self.replica_context.all_reduce(tf.distribute.ReduceOp.SUM, missing)
            self._reduced.update({id(g): (g, total) for g, total in zip(missing, summed)})

        def total(g: Tensor | None) -> Tensor | None:
            return None if g is None else self._reduced[id(g)][1]

        for grads, variables, scale in self._unsummed:
            self._keep_grads([total(g) for g in grads], variables, scale)
        for clipped in self._clipped:
            self.applied = (self.applied or []) + [total(g) for g in clipped]
        self._unsummed, self._clipped = [], []

    def values(self, x: Any, y: Any, loss: Tensor | None, layers: Sequence[Layer]
               ) -> tuple[dict[str, Tensor], Tensor, list[Tensor]]:
        """The SCALARS of this step by name, and the per-variable rows, from what the hooks caught.

        Args:
            x, y: the batch's inputs and targets (structures of tensors, y may be None).
            loss: the step's loss tensor, or None where the `compute_loss` hook caught it (or there is none).
            layers: the probed layers, for their loss terms.

        A step with no loss at all records `loss_missing`: NaN for the loss, which is then unknown, and no
        non-finite loss (that would be a finding about a value nobody saw).
        """
        self._sum_replicas()
        replica, terms = self.replica_values(x, y, loss, layers)
        var_rows, grad_norm, applied_norm = self._variable_rows()
        values = {
            **replica, "grad_global_norm": grad_norm,
            "grad_nonfinite": tf.reduce_sum(var_rows[:, VARIABLE.at("grad_nonfinite")]),
            "weights_nonfinite": tf.reduce_sum(var_rows[:, VARIABLE.at("weight_nonfinite")]),
            "applied_grad_global_norm": applied_norm,
            "loss_scale": self.scale_after if self.scale_after is not None else tf.constant(0.0),
        }
        return values, var_rows, terms

    def replica_values(self, x: Any, y: Any, loss: Tensor | None, layers: Sequence[Layer]
                       ) -> tuple[dict[str, Tensor], list[Tensor]]:
        """The SCALARS known before the update (`REPLICA_SCALARS`), and the layer loss terms; made once."""
        if self._replica_part is not None:
            return self._replica_part
        flat_x = [t for t in tf.nest.flatten(x) if t is not None and tf.is_tensor(t)]
        total = self.loss if loss is None else loss
        missing = total is None
        total = tf.cast(tf.reduce_sum(total), tf.float32) if not missing else tf.constant(float("nan"))
        if self.replicas > 1:
            total = total * self.replicas  # Keras divides each replica's loss by the replica count
        terms = loss_terms(layers, self.keras_models)
        skipped = tf.cast(tf.reduce_any(tf.stack(self.skipped)), tf.float32) if self.skipped else tf.constant(0.0)
        values = {
            "loss": total, "data_loss": total - tf.add_n(terms),
            "x_nonfinite": count_nonfinite(flat_x),
            "y_nonfinite": count_nonfinite([t for t in tf.nest.flatten(y) if tf.is_tensor(t)] if y is not None else []),
            "output_nonfinite": count_nonfinite(tf.nest.flatten(self.y_pred) if self.y_pred is not None else []),
            "loss_nonfinite": tf.constant(0.0) if missing else tf.cast(tf.logical_not(tf.math.is_finite(total)),
                                                                       tf.float32),
            "update_skipped": skipped,
            "loss_scale_before": self.scale_before if self.scale_before is not None else tf.constant(0.0),
            "loss_missing": tf.constant(1.0 if missing else 0.0),
        }
        self._replica_part = values, terms
        return self._replica_part

    def scalars(self, values: dict[str, Tensor], y: Any, sample_weight: Any) -> Tensor:
        """SCALARS in order, then OUTPUT's columns per output of a multi-output model."""
        return tf.stack(SCALARS.pack(values) + self._output_columns(y, sample_weight))

    def _output_columns(self, y: Any, sample_weight: Any) -> list[Tensor]:
        """OUTPUT's columns per output of a multi-output model: its own loss, non-finite targets and prediction."""
        if not self.outputs:
            return []
        terms = output_terms(self.model, y, self.y_pred, sample_weight)
        if len(terms) != self.outputs:  # targets that cannot be paired with the outputs: nothing to split
            return [tf.constant(0.0)] * (self.outputs * len(OUTPUT))
        return [column for loss, target, prediction in terms for column in OUTPUT.pack({
            "loss": loss, "target_nonfinite": count_nonfinite(tf.nest.flatten(target)),
            "prediction_nonfinite": count_nonfinite(tf.nest.flatten(prediction))})]

    def _variable_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """variable_rows over what the optimizers saw; a variable without a gradient counts as unchanged."""
        after = [self.after.get(id(v), v) for v in self.trainable]
        before = [self.before.get(id(v), a) for v, a in zip(self.trainable, after)]
        grads = [self.grads.get(id(v), tf.zeros_like(tf.convert_to_tensor(v))) for v in self.trainable]
        return variable_rows(grads, before, after, self.applied)

