"""The `NanScope` callback: attaches a StepProbe for the length of `fit` and hands rows to a FitLog."""

from pathlib import Path

from nanscope.history import DEFAULT_KEEP, DEFAULT_SAMPLE
from nanscope.keras.fitlog import FitLog
from nanscope.keras.probe import StepProbe
from nanscope.keras.workers import worker_role
from nanscope.runtime import tensorflow

tf, keras = tensorflow()


class NanScope(keras.callbacks.Callback):
    """Record nanscope's per-step statistics during `fit`, stop at the first NaN/Inf, report why.

    Per step it records what `nanscope trace-steps` records: loss, gradient norms per
    variable and overall, per-layer output statistics and non-finite counts per phase.
    When training ends it attributes the first non-finite value to a phase and a layer
    or variable, runs the rule catalogue, prints the report and writes the
    `nanscope.trace/1` JSON. The model is left as it was found.

    Args:
        report: str or Path, default None. Write the JSON report here.
        stop_on_nonfinite: bool, default True. Stop training after the first non-finite step.
        verbose: int, default 1. 0 prints nothing; 1 prints the Rich report when training ends.
            Under MultiWorkerMirroredStrategy only the chief prints, and only the chief writes
            `report`, `trace` and `tensorboard`; every worker's `callback.report` holds the records.
        console: rich.console.Console, default None. Where to print (default: stderr).
        tensorboard: str or Path, default None. Write per-step scalars to this TensorBoard log folder.
        trace: str or Path, default None. Write every step's scalars and the kept steps' full rows to this
            JSON-lines trace.
        expect_nonfinite: list of str, default (). fnmatch patterns of layer names whose
            non-finite outputs are intended (attention masks): reported, not counted.
        keep_steps: int, default 500. Full rows (every layer and variable) kept of the first steps, the last
            steps and the steps around an event; memory stays bounded at any run length.
        sample_steps: int, default 500. Full rows kept of an even sample of the steps in between.
        trace_full: bool, default False. Write every step's full row to `trace`.

    Example:
        model.fit(x, y, epochs=3, callbacks=[NanScope(report="nanscope.json")])
        callback.report.first_nonfinite   # FirstNonfinite or None
    """

    def __init__(self, report=None, stop_on_nonfinite=True, verbose=1, console=None, tensorboard=None, trace=None,
                 expect_nonfinite=(), keep_steps=DEFAULT_KEEP, sample_steps=DEFAULT_SAMPLE, trace_full=False):
        super().__init__()
        if isinstance(expect_nonfinite, str):
            raise ValueError("`expect_nonfinite` must be a list of layer-name patterns. "
                             f"Received: expect_nonfinite={expect_nonfinite!r}")
        if not isinstance(keep_steps, int) or keep_steps < 1:
            raise ValueError(f"`keep_steps` must be an int >= 1. Received: keep_steps={keep_steps!r}")
        if not isinstance(sample_steps, int) or sample_steps < 2:
            raise ValueError(f"`sample_steps` must be an int >= 2. Received: sample_steps={sample_steps!r}")
        self.keep_steps, self.sample_steps, self.trace_full = keep_steps, sample_steps, trace_full
        self.report_path = Path(report) if report else None
        self.stop_on_nonfinite = stop_on_nonfinite
        self.verbose = verbose
        self.console = console
        self.tensorboard = tensorboard
        self.trace = trace
        self.expect_nonfinite = list(expect_nonfinite)
        self.report = None
        self._probe = None

    def on_train_begin(self, logs=None):
        self._probe = StepProbe(self.model)
        self._log = FitLog(self, self._probe, worker_role(self.model.distribute_strategy))
        self._probe.attach()

    def on_train_batch_end(self, batch, logs=None):
        if self._probe is None:
            return
        self._log.collect(self._probe.read())
        if self._log.first_nonfinite is not None and self.stop_on_nonfinite:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self._probe is not None:
            self._log.last_epoch_logs = dict(logs or {})

    def on_train_end(self, logs=None):
        if self._probe is None:
            return
        try:
            self._log.collect(self._probe.read())
        finally:
            self._probe.detach()
            self._probe = None
        self.report = self._log.finish()
