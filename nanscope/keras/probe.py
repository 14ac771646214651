"""The fit probe: NanScope's train functions around an instrumented `train_step`, put in place and taken out.

`StepProbe.attach` replaces the model's `train_step` with the instrumented one (keras/probed_step.py: the
snapshot, the hooks and one row of statistics a step) and has Keras rebuild its train function around it;
`detach` puts both back. Around the train function it adds what runs on the host once an execution: the
sentinel's choice of the full or the light function, the per-call hooks under `tf.distribute`, and the
fallback to the user's own step when the instrumented one fails to compile. `read` turns the rows written
since the last read into StepRecords.

Under `tf.distribute` (a model compiled under `strategy.scope()`), Keras runs `train_step` once per replica;
each replica writes its own row into its copy of an on-read buffer with a replica axis (`RowBuffer`), and under
the guard keeps its own state and share of the batch on its device (`keras.replica_snapshot`). On one device none
of this is traced: the step is the same as without a strategy.

Under `jit_compile=True` the train function Keras builds around the step is left without XLA, and the
instrumented step is compiled by XLA on its own, with the snapshot taken between the two.

nanscope is a guest in the user's `fit`: a failure of its own code while the step is
traced is caught, kept in `failure`, and the step goes on uninstrumented.
"""

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nanscope.engine.model_view import probed_layers, relative_variable_names
from nanscope.engine.probes import LayerRecorder
from nanscope.internals import rebuild_train_function, replace_train_step, restore, set_train_function
from nanscope.keras.model_parts import multi_output_names, training_optimizers
from nanscope.keras.probed_step import ProbedSteps
from nanscope.keras.rows import RowBuffer
from nanscope.keras.snapshot import StepSnapshot
from nanscope.keras.step_row import Data, Logs, TrainFunction
from nanscope.keras.trace_count import FirstTrace, makes_variables
from nanscope.tf_types import KerasModel

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord
    from nanscope.guard.sentinel import SentinelRows


class StepProbe:
    """Wraps a Keras model's `train_step` so the compiled step also writes a row of statistics.

    Args:
        model: keras.Model, compiled and built. Its `train_step` and `train_function` are
            replaced by `attach()` and put back by `detach()`.
        expected: list of int. Indices of layers whose non-finite outputs are intended.
        forensics: bool, default True. Keep the state before each step and its batch on the
            device (one copy of the weights and of the optimizer's slots), for the replay.
        metrics: bool, default False. Copy the metrics' totals with that state (the guard puts
            them back with a skipped step).
        sentinel: int, default None. `mode="sentinel"`: every Nth execution runs the full step, the
            others only what detection needs (`nanscope.guard.sentinel`). One device only.
        built_ahead: bool, default False. nanscope made variables of the model (or of the optimizers) from the
            first batch, before the step's first trace would have (`keras.trace_count`).
        guarded: bool, default False. The guard needs the state before each step (skip, rollback, a ring): under
            tf.distribute it is kept, per replica, only then (`keras.replica_snapshot`).
    """

    sentinel: "SentinelRows | None"  # set in __init__ (where SentinelRows is imported only under mode="sentinel")

    def __init__(self, model: KerasModel, expected: Iterable[int] = (), forensics: bool = True, metrics: bool = False,
                 sentinel: int | None = None, built_ahead: bool = False, guarded: bool = False) -> None:
        self.model = model
        self.optimizers = training_optimizers(model)
        optimizer = model.optimizer
        if optimizer in self.optimizers and not optimizer.built:
            # What Keras does on the first step, done before it.
            built_ahead = makes_variables(lambda: optimizer.build(model.trainable_variables)) or built_ahead
        self.first_trace = FirstTrace(built_ahead)
        self.layers = probed_layers(model)
        self.trainable = list(model.trainable_variables)
        self.variable_names = relative_variable_names(self.trainable, model)
        self.per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        self.layer_probe = LayerRecorder(self.layers)
        self.output_names = multi_output_names(model)
        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.rows = RowBuffer(len(self.layers), len(self.trainable), len(self.output_names), self.per_execution,
                              self.strategy if self.replicas > 1 else None)
        self.expected = list(expected)
        self.snapshot: StepSnapshot | None = None
        self.forensics_off = "tf.distribute" if self.replicas > 1 else None
        # Why the guard has no state, when it has none.
        self.state_off = None if not forensics or self.forensics_off is None else (
            "under tf.distribute it is kept, per replica, only under on_nonfinite='skip' or 'rollback', "
            "skip_spikes=True or snapshot_every=N")
        state = list(model.variables) + [v for optimizer in self.optimizers for v in optimizer.variables]
        extra = list(model.metrics_variables) if metrics else []
        if forensics and self.forensics_off is None:
            self.snapshot = StepSnapshot(state, freezing=self.per_execution > 1, extra=extra)
        elif forensics and guarded:
            self.state_off = replica_state_off(model, self.rows.gathered, self.per_execution)
            if self.state_off is None:
                from nanscope.keras.replica_snapshot import ReplicaStepSnapshot

                self.snapshot = ReplicaStepSnapshot(state, self.strategy, extra=extra)
        # XLA compiles fixed shapes and the batch copy is a variable of any shape: under jit_compile=True
        # the snapshot is taken in a step of nanscope's own, not compiled, around the user's step compiled by XLA.
        self.xla_inside = bool(model.jit_compile) and self.snapshot is not None
        self.original_step = model.train_step
        # Run on the host after each execution (the guard).
        self.after_execution: Callable[[Logs], Logs] | None = None
        self.sentinel = None
        if sentinel and self.replicas == 1:
            from nanscope.guard.sentinel import SentinelRows

            self.sentinel = SentinelRows(self.rows.counter, len(self.output_names), self.per_execution, sentinel)
        self.steps = ProbedSteps(model, self.optimizers, self.layers, self.layer_probe, self.rows,
                                 len(self.output_names), self.expected, self.snapshot, self.sentinel,
                                 self.first_trace, self.xla_inside, self.original_step)
        self.moments = self.steps.moments
        self._last_full = True
        self._saved: tuple[tuple[Any, str, Any], TrainFunction] | None = None  # (the train step's, the function)

    @property
    def failure(self) -> Exception | None:
        """The first failure of nanscope's own code in the step (the step went on without it), or None."""
        return self.steps.failure

    def attach(self) -> None:
        """Replace `train_step` with the instrumented one and rebuild the train function around it."""
        model = self.model
        self._saved = (replace_train_step(model, self.steps.instrumented(self.original_step)), model.train_function)
        with xla_outside_off(model, self.xla_inside):
            function = rebuild_train_function(model)
        if self.sentinel is not None:
            function = self._sampling(function)
        if self.replicas > 1:
            function = self._hooked_per_call(function)
        set_train_function(model, self._detaching_on_error(function))

    def detach(self) -> None:
        """Put `train_step` and the train function back as they were found."""
        if self._saved is None:
            return
        step, function = self._saved
        self._saved = None
        restore(step)
        set_train_function(self.model, function)

    @property
    def attached(self) -> bool:
        return self._saved is not None

    def retrace(self) -> None:
        """Trace the step again on its next call (an optimizer setting read at trace time changed: clipping)."""
        self.steps.forget_rerun()
        if self.attached:
            self.detach()
            self.attach()

    def _sampling(self, full: TrainFunction) -> TrainFunction:
        """Sentinel mode: the full train function on sampled executions and after events, else the light one."""
        sentinel = self.sentinel
        assert sentinel is not None  # `attach` samples only with a sentinel
        with xla_outside_off(self.model, self.xla_inside):
            light = rebuild_train_function(self.model)

        @functools.wraps(full)
        def train_function(iterator: Any) -> Logs:
            self._last_full = sentinel.full_now = sentinel.due_full()  # read again if a step is traced
            return (full if self._last_full else light)(iterator)

        return train_function

    def _hooked_per_call(self, function: TrainFunction) -> TrainFunction:
        """The train function with the layer and optimizer hooks attached for each call (under tf.distribute)."""
        hub = self.steps.shared_capture()
        make_batch = getattr(self.snapshot, "make_batch", None)  # a ReplicaStepSnapshot's, under the guard

        @functools.wraps(function)
        def train_function(iterator: Any) -> Logs:
            if make_batch is not None:
                make_batch(getattr(iterator, "element_spec", None))
            with self.layer_probe.attached(), hub.attached():
                return function(iterator)

        return train_function

    def _detaching_on_error(self, function: TrainFunction) -> TrainFunction:
        # Keras calls on_train_end only when fit returns: an error inside a step must
        # still leave the model as it was found. StopIteration ends every epoch.
        # A count, not a list of calls: the function runs once per execution for the whole fit.
        calls = 0

        @functools.wraps(function)
        def train_function(iterator: Any) -> Logs:
            nonlocal calls
            calls += 1
            try:
                logs = function(iterator)
            except StopIteration:
                raise
            except Exception as exc:
                original = self._saved[1] if self._saved is not None else None
                self.detach()
                if calls > 1 or original is None:
                    raise
                # The first call compiles the step: when the instrumented step cannot run (a
                # compiler that rejects nanscope's ops) but the user's own step can, the
                # failure is nanscope's, and fit goes on without it.
                logs = original(iterator)
                self.steps.failed(exc)
                return logs
            except BaseException:
                self.detach()
                raise
            return self.after_execution(logs) if self.after_execution is not None else logs

        return train_function

    def read(self) -> list["StepRecord"]:
        """StepRecords of the steps finished since the last read, in step order."""
        if not self._last_full:
            assert self.sentinel is not None  # only a sentinel runs the light train function
            records = self.sentinel.read(self.rows.next_step)
            if records:
                self.rows.next_step = records[-1].step + 1
            return records
        return [self.rows.record(step, row) for step, row in self.rows.read()]

    def rerun(self, data: Data, step: int = -1) -> "StepRecord":
        """The step again, compiled, on `data` from the variables as they are: its StepRecord
        (`ProbedSteps.rerun`; under tf.distribute `data` is the replicas' held batches)."""
        return self.steps.rerun(data, step)

    @property
    def call_order(self) -> list[str]:
        """Probed layer names in execution order, as seen when the step was traced."""
        return [self.layers[i].name for i in self.layer_probe.call_order]


def replica_state_off(model: KerasModel, gathered: bool, per_execution: int) -> str | None:
    """Why each replica's state cannot be kept under this strategy, or None when it can (MirroredStrategy on one
    host, one step an execution, no XLA)."""
    if gathered:
        return "MultiWorkerMirroredStrategy"
    if per_execution > 1:
        return "tf.distribute with steps_per_execution > 1"
    if model.jit_compile:
        return "tf.distribute with jit_compile=True"
    return None


@contextlib.contextmanager
def xla_outside_off(model: KerasModel, off: bool) -> Iterator[None]:
    """While Keras builds the train function: without XLA around `train_step` when `off` (it compiles its own)."""
    if not off:
        yield
        return
    model.jit_compile = False
    try:
        yield
    finally:
        model.jit_compile = True
