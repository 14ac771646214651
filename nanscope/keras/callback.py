"""The `NanScope` callback: attaches a StepProbe for the length of `fit` and hands its records to a StepRecorder.

nanscope is a guest in the user's `fit`: whatever fails in nanscope's own code becomes
one warning line and a note in the report, the callback stops recording, and
training goes on as it would have without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.errors import first_line
from nanscope.guard.options import GuardOptions, guard_options, resolve_on_nonfinite
from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE
from nanscope.keras.recorder import GuestOptions
from nanscope.runtime import tensorflow

tf, keras = tensorflow()

# mypy cannot take a base class from `tensorflow()`'s return value; it reads Keras' own name.
if TYPE_CHECKING:
    from keras.callbacks import Callback
    from rich.console import Console

    from nanscope.keras.fitrun import FitRun
    from nanscope.report.model import TraceReport
else:
    Callback = keras.callbacks.Callback
log = logging.getLogger("nanscope")


class NanScope(Callback):
    """Record nanscope's per-step statistics during `fit`, stop at the first NaN/Inf, report why.

    Per step it records what `nanscope trace-steps` records: loss, gradient norms per
    variable and overall, per-layer output statistics, non-finite counts per phase, the
    loss scale and skipped updates under mixed precision, and per-feature statistics of
    the inputs and targets. At the first non-finite step it replays that step eagerly
    from a copy kept on the device, to name the op, its layer and its source line. When
    training ends it runs the rule catalogue, prints the report and writes the
    `nanscope.trace/1` JSON. The model is left as it was found.

    Args:
        report: str or Path, default None. Write the JSON report here.
        on_nonfinite: str, default "stop". What a non-finite step does: "stop" training after it;
            "continue" recording; "skip" its update (the weights, the optimizer's state and the
            metrics go back to before the step; its logs say `nanscope_skipped`) and go on;
            "rollback" to an earlier state (kept every `snapshot_every` steps) with the learning
            rate lowered, and go on. Every intervention is in the report (`interventions`).
        stop_on_nonfinite: bool, default None. Alias of `on_nonfinite`: True "stop", False "continue".
        max_skips: int or (int, int), default (10, 100). Consecutive and total skips; one more stops the run.
        snapshot_every: int, default None. Steps between the earlier states kept on the host for `rollback`
            and the `origin` verdict; None: 100 under "rollback", else none (each is a host copy of the
            weights and the optimizer's state).
        skip_spikes: bool, default False. Skip a step whose loss or gradient norm spikes (a robust z-score
            over 6 over the last 128 steps) too.
        mode: str, default "full". "sentinel": per step only what detection needs (the loss, the global
            gradient norm, the non-finite counts, the state before the step), the full statistics on every
            100th execution and after an event; the first non-finite step is re-run in full and replayed
            op by op as in full mode (docs/guard.md gives the cost).
        guard: GuardOptions, default None. The guard's other settings (`nanscope.guard.GuardOptions`);
            the arguments above override its fields.
        verbose: int, default 1. 0 prints nothing; 1 prints the Rich report when training ends.
            Under MultiWorkerMirroredStrategy only the chief prints, and only the chief writes
            `report`, `trace` and `tensorboard`; every worker's `callback.report` holds the records.
        console: rich.console.Console, default None. Where to print (default: stderr).
        tensorboard: str or Path, default None. Write per-step scalars to this TensorBoard log folder.
        trace: str or Path, default None. Write every step's scalars and the kept steps' full rows to this
            JSON-lines trace.
        expect_nonfinite: list of str, default (). fnmatch patterns of layer names whose
            non-finite outputs are intended (attention masks): reported, not counted.
        forensics: bool, default True. Keep the weights and optimizer state before each step,
            and its batch, on the device (one extra copy of each), and replay the first
            non-finite step. False saves that memory; the report then names no op.
        keep_steps: int, default 500. Full rows (every layer and variable) kept of the first steps, the last
            steps and the steps around an event; memory stays bounded at any run length.
        sample_steps: int, default 500. Full rows kept of an even sample of the steps in between.
        trace_full: bool, default False. Write every step's full row to `trace`.
        repro: str or Path, default None. Save the first non-finite step to this folder as a repro bundle:
            the model (`model.save`), the weights and optimizer state before the step, and its batch.
            `nanscope replay DIR` replays it op by op; `nanscope replay DIR --verify` tries the fixes on it.
            Needs `forensics=True`. A model that cannot be saved and loaded back gets a note instead.

    Example:
        model.fit(x, y, epochs=3, callbacks=[NanScope(report="nanscope.json")])
        callback.report.first_nonfinite   # FirstNonfinite or None
        model.fit(x, y, callbacks=[NanScope(repro="nan-step")])   # then: nanscope replay nan-step --verify
        model.fit(x, y, callbacks=[NanScope(on_nonfinite="skip", max_skips=(3, 20))])  # keep training alive
    """

    def __init__(self, report: str | os.PathLike | None = None, stop_on_nonfinite: bool | None = None,
                 verbose: int = 1, console: Console | None = None, tensorboard: str | os.PathLike | None = None,
                 trace: str | os.PathLike | None = None, expect_nonfinite: Sequence[str] = (),
                 forensics: bool = True, keep_steps: int = DEFAULT_KEEP, sample_steps: int = DEFAULT_SAMPLE,
                 trace_full: bool = False, repro: str | os.PathLike | None = None, on_nonfinite: str | None = None,
                 max_skips: int | tuple | None = None, snapshot_every: int | None = None,
                 skip_spikes: bool | None = None, mode: str | None = None,
                 guard: GuardOptions | None = None) -> None:
        super().__init__()
        guard = guard_options(guard, on_nonfinite=resolve_on_nonfinite(on_nonfinite, stop_on_nonfinite),
                              max_skips=max_skips, snapshot_every=snapshot_every, skip_spikes=skip_spikes,
                              mode=mode)
        if isinstance(expect_nonfinite, str):
            raise ValueError("`expect_nonfinite` must be a list of layer-name patterns. "
                             f"Received: expect_nonfinite={expect_nonfinite!r}")
        if not isinstance(keep_steps, int) or keep_steps < 1:
            raise ValueError(f"`keep_steps` must be an int >= 1. Received: keep_steps={keep_steps!r}")
        if not isinstance(sample_steps, int) or sample_steps < 2:
            raise ValueError(f"`sample_steps` must be an int >= 2. Received: sample_steps={sample_steps!r}")
        if repro is not None and not forensics:
            raise ValueError("`repro` needs the snapshot that `forensics=True` keeps. "
                             f"Received: repro={str(repro)!r}, forensics=False")
        self.options = GuestOptions(
            report=Path(report) if report else None, stop_on_nonfinite=guard.stops, verbose=verbose,
            console=console, tensorboard=tensorboard, trace=trace, expect_nonfinite=list(expect_nonfinite),
            forensics=forensics, keep_steps=keep_steps, sample_steps=sample_steps, trace_full=trace_full,
            repro=Path(repro) if repro is not None else None, guard=guard)
        self.report: TraceReport | None = None
        self._run: FitRun | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        del logs  # Unused
        from nanscope.keras.fitrun import FitRun

        self.report, self._run = None, None
        try:
            self._run = FitRun(self.model, self.params or {}, self.options)
        except Exception as exc:
            log.warning("nanscope: NanScope could not start (%s: %s); training goes on without it",
                        type(exc).__name__, first_line(exc))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        del batch, logs  # Unused
        if self._run is not None and self._run.recording:
            self._run.batch_end()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        del logs  # Unused
        if self._run is not None:
            self._run.epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        del epoch  # Unused
        if self._run is not None:
            self._run.last_epoch_logs = dict(logs or {})

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        del logs  # Unused
        run, self._run = self._run, None
        if run is None:
            return
        if run.recording:
            run.guarded("recording", run.collect)
        run.stop()
        try:
            self.report = run.finish()
        except Exception as exc:
            log.warning("nanscope: the NanScope report could not be built (%s: %s); training was not affected",
                        type(exc).__name__, first_line(exc))
