"""The host side of NanScope: records as they arrive, the first non-finite step, the report."""

from nanscope.engine.records import expected_layer_indices, first_nonfinite_replica, first_nonfinite_worker
from nanscope.engine.step import LayerInfo
from nanscope.keras.workers import WorkerRole, describe_strategy
from nanscope.history import StepHistory
from nanscope.optimizers import optimizer_settings
from nanscope.report import FirstNonfinite, TraceReport


class FitLog:
    """The host side of a NanScope run: records as they arrive, the first non-finite step, the report.

    Args:
        callback: NanScope. Its options (stop, verbose, console, outputs, expected layers).
        probe: StepProbe. The attached probe, for names and buffer rows.
        role: WorkerRole, default one worker. Under MultiWorkerMirroredStrategy, only the chief
            prints and writes the report, the trace and the TensorBoard log.
    """

    def __init__(self, callback, probe, role=None):
        self.callback, self.probe = callback, probe
        self.role = role or WorkerRole()
        self.model = callback.model
        self.first_nonfinite, self.dropped = None, 0
        self.last_epoch_logs = {}
        self.expected = expected_layer_indices(callback.expect_nonfinite, [layer.name for layer in probe.layers])
        self.history = StepHistory(len(probe.layers), len(probe.trainable), len(probe.output_names),
                                   callback.keep_steps, callback.sample_steps)
        self.report = TraceReport(
            run=describe_fit(self.model, callback.params or {}, probe, self.role), history=self.history,
            layers=[(layer.name, type(layer).__name__) for layer in probe.layers], layer_order=[],
            variables=probe.variable_names, trace_path=str(callback.trace) if callback.trace else None,
        )
        self.board = self._open_board() if callback.tensorboard and self.role.chief else None
        self.writer = None

    def _open_board(self):
        from nanscope.tensorboard import TensorBoardLog

        return TensorBoardLog(self.callback.tensorboard, self.report.layers, self.report.variables,
                              self.probe.output_names)

    def collect(self, rows):
        """Turn fresh buffer rows into records; attribute the first non-finite one."""
        for step, row in rows:
            if self.first_nonfinite is not None and self.callback.stop_on_nonfinite:
                self.dropped += 1
                continue
            record = self.probe.record(step, row)
            record.expected_nonfinite = list(self.expected)
            record.worker_nonfinite = self.role.per_worker(record.replica_nonfinite)
            self._keep(record)
            if record.phase is not None and self.first_nonfinite is None:
                self.first_nonfinite = self._attribute(record)
        if self.writer is not None:
            self.writer.flush_steps()  # the trace holds every collected step, a line per collection

    def _keep(self, record):
        """Put one step in the history, the trace and TensorBoard."""
        kept = self.history.add(record)
        if self.board is not None:
            self.board.write(record)
        if self.callback.trace and self.role.chief:
            from nanscope.tracefile import TraceWriter

            if self.writer is None:
                self.report.layer_order = self.probe.call_order
                self.writer = TraceWriter(self.callback.trace, self.report.trace_header(), self.history,
                                          self.callback.trace_full)
            self.writer.step(record, kept)

    def _attribute(self, record):
        from nanscope.trace import _attribute_from_record

        if record.phase == "data":
            detail = [f"{name}: {count} non-finite value(s) in the batch"
                      for name, count in (("x", record.x_nonfinite), ("y", record.y_nonfinite)) if count]
            return FirstNonfinite(step=record.step, phase="data", detail=detail, worker=first_nonfinite_worker(record),
                                  replica=first_nonfinite_replica(record))
        return _attribute_from_record(record, _Layout(self.probe), None, None, None)

    def finish(self):
        """Build the report, print it and write its JSON; close the outputs."""
        from nanscope.rules.diagnose import diagnose

        report = self.report
        report.layer_order = self.probe.call_order
        report.run["outputs"] = fit_outputs(self.model, self.probe)
        report.first_nonfinite = self.first_nonfinite
        val_loss = self.last_epoch_logs.get("val_loss")
        if self.first_nonfinite is None and val_loss is not None:
            report.validation_loss = float(val_loss)
        report.notes.extend(self._notes())
        report.run.update(rows_seen(self.history, (self.callback.params or {}).get("steps")))
        report.recommendations = diagnose(report, FitEvidence(report.run["loss"], self.model))
        self._close(report)
        if self.callback.verbose and self.role.chief:
            from rich.console import Console

            from nanscope.render.trace_report import render_trace_report

            render_trace_report(report, self.callback.console or Console(stderr=True, soft_wrap=False))
        if self.callback.report_path is not None and self.role.chief:
            from nanscope.jsonio import write_json

            write_json(str(self.callback.report_path), report.to_json())
        return report

    def _close(self, report):
        if self.board is not None:
            self.board.close()
        if self.writer is not None:
            from nanscope.trace import finish_trace

            finish_trace(self.writer, report)
            self.writer.close()

    def _notes(self):
        notes = ["recorded inside model.fit by nanscope.keras.NanScope; the failing step is not replayed op by op "
                 "(the callback keeps no batch), and the data-scale rules need the training arrays, which a callback "
                 "does not see: run `nanscope trace-steps` on a spec for those"]
        if self.probe.per_execution > 1:
            notes.append(f"steps_per_execution={self.probe.per_execution}: every step was recorded (a buffer row per "
                         "step of an execution)")
        if self.dropped:
            notes.append(f"{self.dropped} step(s) after the first non-finite one ran in the same execution "
                         "(steps_per_execution) before training could stop; their records are left out")
        for index in self.expected:
            bad = self.history.layers[index].nonfinite_steps
            if bad:
                notes.append(f"layer {self.probe.layers[index].name}: non-finite outputs on {bad} step(s), expected "
                             "(expect_nonfinite), not counted as a problem")
        return notes


class _Layout:
    """The names `trace._attribute_from_record` reads from an engine, taken from a StepProbe."""

    def __init__(self, probe):
        self.layer_info = [LayerInfo(layer.name, type(layer).__name__) for layer in probe.layers]
        self.layer_call_order = probe.call_order
        self.variable_names = probe.variable_names
        self.loss = _Named(None)
        self.loss.outputs = [_Named(name) for name in probe.output_names]


class FitEvidence:
    """What `diagnose` reads from a Session, for a run that only saw `fit`: the loss name and the model.

    `train` is None: a callback never sees the training arrays, so the data-scale
    detectors skip rather than guess.
    """

    def __init__(self, loss_name, keras_model):
        self.loss = _Named(loss_name)
        self.model = _ModelView(keras_model)
        self.train = None


class _Named:
    def __init__(self, name):
        self.name = name


class _ModelView:
    def __init__(self, keras_model):
        self.keras_model = keras_model


def describe_fit(model, params, probe, role=None):
    """The run header of a `fit` run, with the fields trace-steps' header has where they are known."""
    optimizer_name, optimizer_config = optimizer_settings(model.optimizer)
    epochs, steps = params.get("epochs"), params.get("steps")
    return {
        "spec": "model.fit (nanscope.keras.NanScope)",
        "model": f"{model.name} ({type(model).__name__}, {len(probe.layers)} layers)",
        "model_kind": "keras-fit",
        "parameters": int(model.count_params()),
        "data": "as given to fit",
        "train_rows": None,
        "validation_rows": None,
        "batch_size": None,
        "shuffle": None,
        "loss": _loss_name(getattr(model, "loss", None)),
        "optimizer": optimizer_name,
        "optimizer_config": optimizer_config,
        "steps_requested": epochs * steps if epochs and steps else None,
        "seed": None,
        "jit_compile": bool(model.jit_compile),
        "steps_per_execution": probe.per_execution,
        **({"distribute": describe_strategy(probe.strategy, probe.replicas, role or WorkerRole())}
           if probe.replicas > 1 else {}),
    }


def rows_seen(history, steps_per_epoch):
    """The header's `batch_size` (the first batch's rows) and `train_rows` (the rows of the first whole epoch),
    from the batches the callback saw (a StepHistory); empty where it saw too little to say."""
    seen = {}
    rows = history.column("batch_rows")
    if len(rows):
        seen["batch_size"] = int(rows[0])
    if steps_per_epoch and len(rows) >= steps_per_epoch:
        seen["train_rows"] = int(rows[:steps_per_epoch].sum())
    return seen


def fit_outputs(model, probe):
    """The run header's `outputs` of a fit run: per output of a multi-output model its name, loss and weight."""
    from nanscope.keras.outputs import output_loss_specs

    specs = output_loss_specs(model)
    if len(specs) != len(probe.output_names):
        return [{"name": name, "loss": None, "weight": None} for name in probe.output_names]
    return [{"name": name, "loss": loss, "weight": weight}
            for name, (_, loss, weight) in zip(probe.output_names, specs)]


def _loss_name(loss):
    if loss is None:
        return "compute_loss"
    if isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return ", ".join(f"{name}: {_loss_name(one)}" for name, one in loss.items())
    if isinstance(loss, (list, tuple)):
        return ", ".join(_loss_name(one) for one in loss)
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
