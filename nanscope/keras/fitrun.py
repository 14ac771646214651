"""One `fit` as NanScope sees it: the probe on the device, the recorder on the host, the forensic replay.

A model that is not built when `fit` starts (a subclassed model, a Sequential without
an `Input`) is built from the first batch's shapes and dtypes, as Keras itself builds
it, just before the first step runs; every step is then recorded, the first included.
Every failure of nanscope's own code is caught by `guarded`: one warning line, a note
in the report, recording stops, and `fit` goes on as it would have without nanscope.
"""

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from nanscope.engine.records import expected_layer_indices
from nanscope.engine.model_view import probed_layers
from nanscope.data.inputs import id_inputs
from nanscope.errors import first_line
from nanscope.guard.host import GuestGuard
from nanscope.keras.guest_fix import guest_fixer
from nanscope.internals import compile_metrics_built, flatten_layers, set_train_function, symbolic_build
from nanscope.forensics.random_state import random_state_kept
from nanscope.keras.forensics import GuestForensics, labelled_fit_batch
from nanscope.keras.header import fit_header, fit_outputs, rows_seen
from nanscope.report.header import run_header
from nanscope.keras.model_parts import held_optimizers
from nanscope.keras.probe import StepProbe
from nanscope.run.attribution import StepNames
from nanscope.keras.recorder import StepRecorder
from nanscope.keras.trace_count import makes_variables
from nanscope.model.learning_rate import LearningRateView
from nanscope.keras.workers import worker_role
from nanscope.rules.evidence import RunEvidence
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord
    from nanscope.keras.recorder import GuestOptions
    from nanscope.report.model import FirstNonfinite, TraceReport
    from nanscope.rules.rule import Recommendation

DatasetIterator: TypeAlias = Any

log = logging.getLogger("nanscope")


class FitRun:
    """nanscope's part of one `fit` call.

    Args:
        model: keras.Model, compiled.
        params: dict. The callback's `params` (epochs, steps).
        options: GuestOptions.
    """

    def __init__(self, model: KerasModel, params: dict[str, Any], options: "GuestOptions") -> None:
        self.model, self.params, self.options = model, params, options
        self.probe: StepProbe | None = None
        self.recorder: StepRecorder | None = None
        self.forensics: GuestForensics | None = None
        self.recording, self.steps_seen = True, 0
        self.notes: list[str] = []
        self.last_epoch_logs: dict[str, Any] = {}
        self.epoch = 0
        self.repro_note: str | None = None
        self.repro_written = False
        self.guard: GuestGuard | None = None
        self._collected = False  # the latest execution was collected by the train function's hook
        # A skip puts the metrics' totals back too: they must exist before the step is traced.
        if is_built(model) and (compile_metrics_built(model) or not options.guard.intervenes):
            self._start()
        else:
            self._start_on_first_call()

    def _start(self, built_ahead: bool = False) -> None:
        model, options = self.model, self.options
        expected = expected_layer_indices(options.expect_nonfinite, [layer.name for layer in probed_layers(model)])
        sentinel = options.guard.sample_every if options.guard.mode == "sentinel" else None
        probe = self.probe = StepProbe(model, expected, forensics=options.forensics,
                                       metrics=options.guard.intervenes, sentinel=sentinel, built_ahead=built_ahead,
                                       guarded=options.guard.intervenes or options.guard.ring_every > 0)
        names = StepNames(layers=[(layer.name, type(layer).__name__) for layer in probe.layers],
                          variables=probe.variable_names, outputs=probe.output_names)
        if probe.snapshot is not None and probe.forensics_off is None:
            self.forensics = GuestForensics(probe.snapshot, probe.original_step, labelled_fit_batch, probe.layers,
                                            [model], probe.optimizers, probe.trainable, model.metrics_variables,
                                            [probe.layers[i].name for i in expected])
        role = worker_role(model.distribute_strategy)
        learning_rate = LearningRateView(probe.optimizers[0] if probe.optimizers else None)
        recorder = self.recorder = StepRecorder(options, fit_header(model, self.params, probe, role, learning_rate),
                                                names, lambda: probe.call_order,
                                                self._locate if self.forensics else None, role, learning_rate)
        self.guard = GuestGuard.for_fit(options.guard, model, probe, recorder, None if probe.replicas > 1 else (
            lambda state, rerun: guest_fixer(options.guard, state, rerun, [model.optimizer], model, recorder,
                                             lambda: RunEvidence(keras_model=model), probe.retrace)))
        probe.after_execution = self._after_execution
        probe.attach()

    def _locate(self, record: "StepRecord", first: "FirstNonfinite") -> None:
        """The forensic replay of the first non-finite step, then its repro bundle when `repro` asks for one."""
        assert self.forensics is not None  # `_start` hands the recorder this method only with forensics
        self.forensics.locate(record, first)
        if self.options.repro is not None:
            self._save_repro(record.step, self.options.repro)

    def _save_repro(self, step: int, where: str | os.PathLike[str]) -> None:
        """Write the bundle of `step` to `where`; a failure is one warning line and a note, never the end of fit."""
        from nanscope.keras.bundle import save_fit_repro

        assert self.probe is not None and self.probe.snapshot is not None  # forensics are replayed from it
        snapshot = self.probe.snapshot
        if snapshot.held_step() != step:
            self.repro_note = f"repro: no bundle written: the device holds step {snapshot.held_step()}, not {step}"
            return
        try:
            code = save_fit_repro(where, self.model, [copy.numpy() for copy in snapshot.state.copies],
                                  snapshot.batch(), step, self.epoch)
        except Exception as exc:
            log.warning("nanscope: the repro bundle of step %d could not be written to %s (%s: %s); training was "
                        "not affected", step, where, type(exc).__name__, first_line(exc))
            self.repro_note = (f"repro: no bundle written to {where}: {type(exc).__name__}: {first_line(exc)}")
            return
        self.repro_written = True
        self.repro_note = (f"repro: step {step} (epoch {self.epoch}) saved to {where}; `nanscope replay {where}` "
                           "replays it, `--verify` tries the fixes on it")
        scripts = sorted({entry.get("origin") or entry["file"] for entry in code if entry["module"] == "__main__"})
        if scripts:
            self.repro_note += (f"; replay imports the running script {', '.join(scripts)} for the model's code: keep "
                                "its training under `if __name__ == \"__main__\":`")

    def _start_on_first_call(self) -> None:
        """Build the model from the first batch's spec when fit first calls its train function, then attach."""
        model = self.model
        original = model.train_function

        def first_call(iterator: DatasetIterator) -> Any:
            set_train_function(model, original)
            if self.guarded("setup", lambda: self._build_and_start(iterator)):
                return model.train_function(iterator)
            return original(iterator)

        set_train_function(model, first_call)
        self._unbuilt_function = original

    def _build_and_start(self, iterator: DatasetIterator) -> None:
        def build() -> None:
            if defines_call(self.model):
                symbolic_build(self.model, iterator.element_spec)
            else:  # nothing to build the model by: the step's trace builds the optimizers it uses
                tf, _ = tensorflow()
                tf.function(self.model.train_step).get_concrete_function(iterator.element_spec)

        with random_state_kept():  # the build traces `call` (or the step) once more than fit would
            built_ahead = makes_variables(build)
        self._start(built_ahead)

    def guarded(self, what: str, action: Callable[[], object]) -> bool:
        """Run nanscope's own `action`; a failure stops recording with one warning line instead of stopping fit."""
        try:
            action()
        except Exception as exc:
            log.warning("nanscope: NanScope stopped %s at step %d (%s: %s); training goes on without it",
                        what, self.steps_seen, type(exc).__name__, first_line(exc))
            self.disable(f"nanscope's own {what} failed at step {self.steps_seen} ({type(exc).__name__}: "
                         f"{first_line(exc)}); recording stopped there and training went on without it")
            return False
        return True

    def collect(self) -> None:
        """Take the rows of the steps just run; stop fit at the first non-finite one when asked to."""
        if not self.recording or self.probe is None:
            return
        assert self.guard is not None and self.recorder is not None  # `_start` made them with the probe
        records = self.guard.complete(self.probe.read())
        self.steps_seen += len(records)
        self.recorder.collect(records)
        if self.probe.failure is not None:
            raise self.probe.failure
        if self.guard.observe(records) and self.guard.stopped:
            self.model.stop_training = True
        if self.recorder.first_nonfinite is not None and self.options.stop_on_nonfinite:
            self.model.stop_training = True

    def batch_end(self) -> None:
        """`on_train_batch_end`: collect what the train function's own hook did not (a step that ran without it)."""
        if self._collected:
            self._collected = False
            return
        self.guarded("recording", self.collect)

    def _after_execution(self, logs: Any) -> Any:
        """After each execution, before any callback sees its logs: record, let the guard act, say what it did."""
        if not self.recording:
            return logs
        self.guarded("recording", self.collect)
        self._collected = True
        assert self.guard is not None  # `_start` made it before it set this hook
        return self.guard.logs(logs) if self.recording else logs

    def disable(self, note: str) -> None:
        """Stop recording and put the model back as it was found; `note` goes into the report."""
        self.recording = False
        self.notes.append(note)
        self.stop()

    def stop(self) -> None:
        """Put the model's train step and train function back."""
        if self.probe is not None:
            self.probe.detach()
        elif getattr(self, "_unbuilt_function", None) is not None:
            set_train_function(self.model, self._unbuilt_function)

    def finish(self) -> "TraceReport | None":
        """The TraceReport of this fit (None when nanscope never started recording)."""
        if self.recorder is None:
            return None
        assert self.probe is not None  # `_start` made it before the recorder
        report = self.recorder.report
        outputs = fit_outputs(self.model, self.probe.output_names)
        report.run = run = run_header(**{**report.run, "outputs": outputs,
                                         **rows_seen(self.recorder.history, self.params.get("steps"))})
        evidence = RunEvidence(keras_model=self.model)
        if self.probe.moments is not None:
            labels = [(label, "float32") for label in self.probe.moments.labels() if label.startswith("x")]
            ids = id_inputs(labels, self.model)
            evidence.features, evidence.targets = self.probe.moments.scales(ids, run.get("loss"), outputs)
        assert self.guard is not None  # made with the recorder (a setup that failed between them fails here, as before)
        self.guard.finish(report)
        report = self.recorder.finish(evidence, self.notes + self._notes() + self.guard.notes(),
                                      self.last_epoch_logs.get("val_loss"))
        if self.repro_written and self.options.repro is not None:  # a bundle is written only where repro says
            self._add_findings_to_bundle(self.options.repro, report.recommendations)
        return report

    def _add_findings_to_bundle(self, where: str | os.PathLike[str], recommendations: list["Recommendation"]) -> None:
        from nanscope.keras.bundle import record_run_findings

        try:
            record_run_findings(where, recommendations)
        except Exception as exc:
            log.warning("nanscope: the run's findings could not be added to the repro bundle %s (%s: %s)",
                        where, type(exc).__name__, first_line(exc))

    def _notes(self) -> list[str]:
        notes = ["recorded inside model.fit by nanscope.keras.NanScope"]
        probe = self.probe
        assert probe is not None  # `finish` asks for the notes of a run that started
        if probe.snapshot is not None and probe.forensics_off is None:
            notes.append(f"forensics: the weights and optimizer state before each step and its batch were kept on "
                         f"the device ({probe.snapshot.nbytes() / 2**20:.1f} MiB besides the batch)")
        elif self.options.forensics:
            notes.append(f"forensics: under {probe.forensics_off} the failing step is not replayed op by op")
            if probe.snapshot is not None:
                notes.append(f"guard: each replica's weights and optimizer state before each step and its share of "
                             f"the batch were kept on its device ({probe.snapshot.nbytes() / 2**20:.1f} MiB in all "
                             "besides the batch)")
        else:
            notes.append("forensics=False: the failing step was not replayed, so no op or source line is named")
        if self.options.repro is not None:
            notes.append(self.repro_note or (f"repro: no bundle written to {self.options.repro}: " + (
                f"under {probe.forensics_off} no bundle is saved" if probe.forensics_off is not None
                else "no step went non-finite")))
        if probe.per_execution > 1:
            notes.append(f"steps_per_execution={probe.per_execution}: every step was recorded (a buffer row per "
                         "step of an execution)")
        return notes


def is_built(model: KerasModel) -> bool:
    """True when every layer in the model and every optimizer it holds is built, and the model itself is
    or has no `call` to be built by.

    A model that overrides `train_step` and never defines `call` (keras-io's VAE and GAN) is
    never built itself: its layers and variables are its built sub-models'.
    """
    return ((model.built or not defines_call(model)) and all(layer.built for layer in flatten_layers(model))
            and all(optimizer.built for optimizer in held_optimizers(model)))


def defines_call(model: KerasModel) -> bool:
    """True when the model's class (or a base below keras.Model) defines `call`."""
    _, keras = tensorflow()
    return type(model).call is not keras.Model.call
