"""The result of a trace-steps run: what was run, what was measured, what it means.

`TraceReport` is plain data. `to_json()` gives the `nanscope.trace/1` document;
the Rich renderer draws from the same fields. It can be rebuilt from a trace file
(`from_trace`) without TensorFlow.
"""

import math
import os
from dataclasses import dataclass, field

from nanscope.engine.records import record_from_dict
from nanscope.errors import EXIT_HEALTHY, EXIT_INTERRUPTED, EXIT_PROBLEM
from nanscope.jsonio import jsonable
from nanscope.rules.catalogue import Recommendation

SCHEMA = "nanscope.trace/1"
STEP_FIELDS = (
    "step", "loss", "data_loss", "grad_global_norm", "applied_grad_global_norm", "x_nonfinite", "y_nonfinite",
    "output_nonfinite", "grad_nonfinite", "weights_nonfinite", "loss_scale", "update_skipped",
)


@dataclass
class FirstNonfinite:
    """Where the first non-finite value of the run appeared.

    Args:
        step: int. The step.
        phase: str. data | forward | loss | backward | update.
        layer: str or None. The layer that produced it (for the forward pass).
        layer_class: str or None. That layer's class.
        variable: str or None. The variable (backward: non-finite gradient; update: non-finite weight).
        op: str or None. The TF op that produced it, once localized.
        source: str or None. `file:line` of the user code that created the op.
        inputs: dict or None. Statistics of the op's input at that moment.
        detail: list of str. Further facts (e.g. which features and rows held NaN).
        replica: int or None. Under tf.distribute, the lowest replica id that saw a non-finite
            value in its batch, outputs or gradients at this step; None on one device.
        worker: int or None. Under MultiWorkerMirroredStrategy, the lowest worker (task) id whose
            replicas saw one; None otherwise.
        output: str or None. For a multi-output model, the output whose targets (data),
            prediction (forward) or own loss (loss) first held the value; None otherwise.
        loss: str or None. The loss the producing op belongs to (an op of the loss, or its gradient);
            `layer` is then None.
        context: dict. What the replay found around the producing op: fully masked softmax rows
            (`masked_rows`, `softmax_rows`, `batch_rows`), the tf.where that threw the op's forward
            value away (`discarded_by`: op and source, `forward_nonfinite`).
    """

    step: int
    phase: str
    layer: str | None = None
    layer_class: str | None = None
    variable: str | None = None
    op: str | None = None
    source: str | None = None
    inputs: dict | None = None
    detail: list = field(default_factory=list)
    replica: int | None = None
    output: str | None = None
    worker: int | None = None
    loss: str | None = None
    context: dict = field(default_factory=dict)


@dataclass
class TraceReport:
    """Everything trace-steps found, ready to render or serialise.

    Args:
        run: dict. What was run: spec, model, parameters, data, loss, optimizer, steps requested.
        layers: list of (name, class) pairs, probe order. Empty for a SavedModel.
        layer_order: list of str. Layer names in execution order.
        variables: list of str. Trainable variable names.
        records: list of StepRecord.
        first_nonfinite: FirstNonfinite or None.
        recommendations: list of Recommendation, most likely cause first.
        validation_loss: float or None. After the last step, when a validation part exists.
        interrupted: bool. The run was stopped by a signal before its step limit.
        notes: list of str. What the report cannot show and why.
        trace_path: str. The JSON-lines trace file.
        stopped: str or None. Why the run ended before its step limit other than by a signal:
            a worker of a multi-worker run went missing. The run's exit code is then 1.
        cluster: Cluster or None. Under `train.distribute: multi_worker`, the worker that made this
            report (only the chief's is written). Not serialised.
    """

    run: dict
    layers: list
    layer_order: list
    variables: list
    records: list
    first_nonfinite: FirstNonfinite | None = None
    recommendations: list = field(default_factory=list)
    validation_loss: float | None = None
    interrupted: bool = False
    notes: list = field(default_factory=list)
    trace_path: str | None = None
    stopped: str | None = None
    cluster: object | None = None

    @property
    def status(self) -> str:
        if self.first_nonfinite is not None:
            return "nonfinite"
        if any(r.severity in ("error", "warning") for r in self.recommendations):
            return "warning"
        return "healthy"

    @property
    def output_names(self) -> list[str]:
        """Names of a multi-output model's outputs (run header `outputs`); one entry for a single output."""
        return [o["name"] for o in self.run.get("outputs") or []]

    @property
    def steps_run(self) -> int:
        return len(self.records)

    def exit_code(self, strict: bool = False) -> int:
        """0 healthy, 1 non-finite, stopped early (or a warning with `strict`), 130 interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.stopped or self.status == "nonfinite" or (strict and self.status == "warning"):
            return EXIT_PROBLEM
        return EXIT_HEALTHY

    def named_in_findings(self) -> tuple[set, set]:
        """(layer names, variable names) that the first non-finite value and the findings name.

        A report that shortens its tables keeps these rows whatever their rank.
        """
        layers, variables = set(), set()
        first = self.first_nonfinite
        if first is not None:
            layers.update(name for name in (first.layer,) if name)
            variables.update(name for name in (first.variable,) if name)
        for rec in self.recommendations:
            data = rec.data or {}
            layers.update(name for name in (data.get("layer"),) if isinstance(name, str))
            variables.update(name for name in (data.get("variable"),) if isinstance(name, str))
        return layers, variables

    def layer_summaries(self) -> list[dict]:
        """Per layer over the run: largest finite max |x|, last mean |x|, non-finite steps, first such step."""
        rows = []
        for index, (name, cls) in enumerate(self.layers):
            stats = [r.layers[index] for r in self.records if index < len(r.layers) and r.layers[index].called]
            bad = [r.step for r in self.records if index < len(r.layers) and r.layers[index].nonfinite]
            rows.append({
                "name": name, "class": cls, "dtype": (self.run.get("layer_dtypes") or {}).get(name),
                "max_abs": max((s.max_abs for s in stats), default=0.0),
                "mean_abs_last": stats[-1].mean_abs if stats else None,
                "zero_fraction_last": stats[-1].zero_fraction if stats else None,
                "underflow_fraction_max": max((s.underflow_fraction for s in stats), default=0.0),
                "nonfinite_last": stats[-1].nonfinite if stats else 0,
                "loss_term_last": stats[-1].loss_term if stats else 0.0,
                "nonfinite_steps": len(bad), "first_nonfinite_step": bad[0] if bad else None,
            })
        return rows

    def variable_summaries(self) -> list[dict]:
        """Per variable over the run: largest and last gradient norm, largest update ratio, non-finite steps."""
        rows = []
        for index, name in enumerate(self.variables):
            stats = [r.variables[index] for r in self.records if index < len(r.variables)]
            bad = [r.step for r in self.records if index < len(r.variables) and (
                r.variables[index].grad_nonfinite or r.variables[index].weight_nonfinite)]
            rows.append({
                "name": name,
                "max_grad_norm": _finite_max(s.grad_norm for s in stats),
                "last_grad_norm": stats[-1].grad_norm if stats else None,
                "max_update_ratio": _finite_max(s.update_ratio for s in stats[1:] or stats),
                "weight_norm_last": stats[-1].weight_norm if stats else None,
                "grad_nonfinite_last": stats[-1].grad_nonfinite if stats else 0,
                "nonfinite_steps": len(bad), "first_nonfinite_step": bad[0] if bad else None,
            })
        return rows

    def output_summaries(self) -> list[dict]:
        """Per output of a multi-output model: its loss and weight, first/last/largest own loss, non-finite steps.

        Empty for a single-output model (its loss is the run's data loss).
        """
        rows = []
        for index, spec in enumerate(self.run.get("outputs") or []):
            stats = [(r.step, r.outputs[index]) for r in self.records if index < len(r.outputs)]
            if not stats:
                return []
            bad = [step for step, o in stats
                   if not math.isfinite(o.loss) or o.target_nonfinite or o.prediction_nonfinite]
            rows.append({
                **spec,
                "first_loss": stats[0][1].loss, "last_loss": stats[-1][1].loss,
                "max_loss": _finite_max(o.loss for _, o in stats),
                "nonfinite_steps": len(bad), "first_nonfinite_step": bad[0] if bad else None,
            })
        return rows

    def to_json(self) -> dict:
        """The `nanscope.trace/1` document."""
        return jsonable({
            "schema": SCHEMA,
            "status": self.status,
            "steps_run": self.steps_run,
            "interrupted": self.interrupted,
            **({"stopped": self.stopped} if self.stopped else {}),
            "run": self.run,
            "first_nonfinite": self.first_nonfinite,
            "steps": [step_json(r, self.output_names) for r in self.records],
            "outputs": self.output_summaries(),
            "layers": self.layer_summaries(),
            "layer_order": self.layer_order,
            "variables": self.variable_summaries(),
            "validation_loss": self.validation_loss,
            "recommendations": self.recommendations,
            "notes": self.notes,
            "trace": self.trace_path,
        })

    def trace_header(self) -> dict:
        """The header line of the trace file."""
        return {"run": self.run, "layers": self.layers, "layer_order": self.layer_order, "variables": self.variables}


def step_json(record, output_names=()):
    """A step of the report's JSON: STEP_FIELDS, the phase, per-replica non-finite counts under tf.distribute,
    and per output of a multi-output model its loss and non-finite counts."""
    row = {**{f: getattr(record, f) for f in STEP_FIELDS}, "phase": record.phase}
    if record.replica_nonfinite:
        row["replica_nonfinite"] = list(record.replica_nonfinite)
    if record.worker_nonfinite:
        row["worker_nonfinite"] = list(record.worker_nonfinite)
    if record.outputs:
        row["outputs"] = {name: vars(stats) for name, stats in zip(output_names, record.outputs)}
    return row


def from_trace(header: dict, step_lines: list[dict], other_lines: list[dict],
               trace_path: str | os.PathLike | None = None) -> TraceReport:
    """Rebuild a TraceReport from a trace file's lines (see tracefile.read_trace)."""
    records = [record_from_dict(line) for line in step_lines]
    summary = next((line for line in reversed(other_lines) if line.get("kind") == "summary"), {})
    first = summary.get("first_nonfinite")
    report = TraceReport(
        run=header.get("run", {}),
        layers=[tuple(pair) for pair in header.get("layers", [])],
        layer_order=header.get("layer_order", []),
        variables=header.get("variables", []),
        records=records,
        first_nonfinite=FirstNonfinite(**first) if first else None,
        recommendations=[Recommendation(**r) for r in summary.get("recommendations", [])],
        validation_loss=summary.get("validation_loss"),
        interrupted=bool(summary.get("interrupted", not summary)),  # no summary: the run was killed mid-way
        stopped=summary.get("stopped"),
        notes=summary.get("notes", []) + _trace_end_notes(summary, other_lines),
        trace_path=str(trace_path) if trace_path else None,
    )
    if first is None and not summary:
        bad = next((r for r in records if r.phase), None)
        report.first_nonfinite = FirstNonfinite(bad.step, bad.phase) if bad else None
    return report


def _trace_end_notes(summary, other_lines):
    """What a trace without a summary line says about how its run ended."""
    notes = [f"the run stopped on an error: {line.get('message', '')}"
             for line in other_lines if line.get("kind") == "error"]
    if not summary and not notes:
        notes.append("the run ended before writing its summary (killed?): the report covers the steps in the trace")
    return notes


def _finite_max(values):
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return max(finite) if finite else None
