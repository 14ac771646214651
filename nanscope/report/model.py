"""The result of a trace-steps run: what was run, what was measured, what it means.

`TraceReport` is plain data. `to_json()` gives the `nanscope.trace/1` document;
the Rich renderer draws from the same fields. It can be rebuilt from a trace file
(`nanscope.report.redraw.load_trace`, streaming, in bounded memory) without TensorFlow.

The steps live in a `StepHistory` (nanscope/store/history.py): every step's scalars, the
full rows of the kept steps, and exact per-layer, per-variable and per-output
aggregates, which the tables below are made of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from nanscope.errors import EXIT_HEALTHY, EXIT_INTERRUPTED, EXIT_PROBLEM
from nanscope.store.aggregates import LayerAggregate, VariableAggregate
from nanscope.engine.records import StepRecord
from nanscope.store.history import StepHistory
from nanscope.jsonio import OMITTED_WHEN_NONE, jsonable

if TYPE_CHECKING:
    from nanscope.engine.cluster import Cluster

SCHEMA = "nanscope.trace/1"
STEP_FIELDS = (
    "step", "loss", "data_loss", "grad_global_norm", "applied_grad_global_norm", "x_nonfinite", "y_nonfinite",
    "output_nonfinite", "grad_nonfinite", "weights_nonfinite", "loss_scale", "update_skipped", "loss_scale_before",
    "loss_missing",
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
            value away (`discarded_by`: op and source, `forward_nonfinite`), and `reached_loss` (true when
            the op's non-finite values reached the loss, whatever a tf.where dropped on the way).
        reproducible: bool or None. Re-run compiled from the state before it on the same batch: True
            non-finite again (deterministic), False finite (nondeterminism or a transient fault), None
            not checked (`nanscope.guard.verdicts`).
        origin: str or None. The same batch from an earlier state: "batch" non-finite there too, "state"
            finite there (the model's state drifted), None not checked.
        reproducible_replicas: list of int or None. Under tf.distribute, the replicas non-finite in the re-run
            behind `reproducible` (empty: finite on every replica). None on one device or not checked, and then
            left out of the JSON.
        origin_replicas: list of int or None. The same for the re-run behind `origin`.
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
    reproducible: bool | None = None
    origin: str | None = None
    reproducible_replicas: list[int] | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    origin_replicas: list[int] | None = field(default=None, metadata=OMITTED_WHEN_NONE)


@dataclass
class TraceReport:
    """Everything trace-steps found, ready to render or serialise.

    Args:
        run: dict. What was run: spec, model, parameters, data, loss, optimizer, steps requested.
        layers: list of (name, class) pairs, probe order. Empty for a SavedModel.
        layer_order: list of str. Layer names in execution order.
        variables: list of str. Trainable variable names.
        history: StepHistory, optional. The steps: every step's scalars, the kept full rows, the aggregates.
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
        interventions: list of dict. What the guard did to the run: {step, action, reason, ...}
            (`nanscope.guard`); empty when it did nothing.
        spikes: list of dict. Loss and gradient-norm spikes the guard found ({step, metric, value, z, ...}).
    """

    run: dict
    layers: list
    layer_order: list
    variables: list
    history: StepHistory | None = None
    first_nonfinite: FirstNonfinite | None = None
    recommendations: list = field(default_factory=list)
    validation_loss: float | None = None
    interrupted: bool = False
    notes: list = field(default_factory=list)
    trace_path: str | None = None
    stopped: str | None = None
    cluster: Cluster | None = None
    interventions: list = field(default_factory=list)
    spikes: list = field(default_factory=list)

    def diagnosis_line(self) -> str:
        """One line: where the first non-finite value appeared and the top finding ("step 3, forward pass, ...")."""
        first = self.first_nonfinite
        if first is None:
            return f"no non-finite value in {self.steps_run} step(s)"
        where = [f"step {first.step}", f"{first.phase} pass"]
        if first.layer:
            where.append(f"layer {first.layer}" + (f" ({first.layer_class})" if first.layer_class else ""))
        if first.op:
            where.append(f"op {first.op}")
        if first.source:
            where.append(first.source)
        top = next((r for r in self.recommendations if r.severity == "error"), None) or (
            self.recommendations[0] if self.recommendations else None)
        finding = f"; {top.id}: {top.title}" if top is not None else ""
        return "non-finite value at " + ", ".join(where) + finding

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
    def records(self) -> list:
        """The kept full rows (StepRecord), in step order: every step of a short run."""
        return self.history.kept() if self.history is not None else []

    @property
    def steps_run(self) -> int:
        return self.history.count if self.history is not None else 0

    def exit_code(self, strict: bool = False) -> int:
        """0 healthy, 1 non-finite, stopped early (or a warning with `strict`), 130 interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.stopped or self.status == "nonfinite" or (strict and self.status == "warning"):
            return EXIT_PROBLEM
        return EXIT_HEALTHY

    def named_in_findings(self) -> tuple[set[str], set[str]]:
        """(layer names, variable names) that the first non-finite value and the findings name.

        A report that shortens its tables keeps these rows whatever their rank.
        """
        layers: set[str] = set()
        variables: set[str] = set()
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
        aggregates = self.history.layers if self.history is not None else []
        rows = []
        for (name, cls), agg in zip(self.layers, aggregates or [LayerAggregate() for _ in self.layers]):
            last = agg.last
            rows.append({
                "name": name, "class": cls, "dtype": (self.run.get("layer_dtypes") or {}).get(name),
                "max_abs": agg.max_abs,
                "mean_abs_last": last.mean_abs if last else None,
                "zero_fraction_last": agg.zero_fraction_last,
                "underflow_fraction_max": agg.underflow_max,
                "nonfinite_last": last.nonfinite if last else 0,
                "loss_term_last": last.loss_term if last else 0.0,
                "nonfinite_steps": agg.nonfinite_steps, "first_nonfinite_step": agg.first_nonfinite_step,
            })
        return rows

    def variable_summaries(self) -> list[dict]:
        """Per variable over the run: largest and last gradient norm, largest update ratio, non-finite steps."""
        aggregates = self.history.variables if self.history is not None else []
        rows = []
        for name, agg in zip(self.variables, aggregates or [VariableAggregate() for _ in self.variables]):
            last = agg.last
            rows.append({
                "name": name,
                "max_grad_norm": agg.max_grad_norm,
                "last_grad_norm": last.grad_norm if last else None,
                "max_update_ratio": agg.max_update_ratio,
                "weight_norm_last": last.weight_norm if last else None,
                "grad_nonfinite_last": last.grad_nonfinite if last else 0,
                "nonfinite_steps": agg.nonfinite_steps, "first_nonfinite_step": agg.first_nonfinite_step,
            })
        return rows

    def output_summaries(self) -> list[dict]:
        """Per output of a multi-output model: its loss and weight, first/last/largest own loss, non-finite steps.

        Empty for a single-output model (its loss is the run's data loss).
        """
        aggregates = self.history.outputs if self.history is not None else []
        rows = []
        for spec, agg in zip(self.run.get("outputs") or [], aggregates):
            if agg.first is None:
                return []
            rows.append({
                **spec,
                "first_loss": agg.first.loss, "last_loss": agg.last.loss, "max_loss": agg.max_loss,  # type: ignore[union-attr]
                "nonfinite_steps": agg.nonfinite_steps, "first_nonfinite_step": agg.first_nonfinite_step,
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
            "interventions": self.interventions,
            "spikes": self.spikes,
            "steps": [step_json(r, self.output_names) for r in self.records],
            "steps_total": self.steps_run,
            "steps_sampling": self.history.sampling_note() if self.history is not None else None,
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


def step_json(record: StepRecord, output_names: Sequence[str] = ()) -> dict[str, Any]:
    """A step of the report's JSON: STEP_FIELDS, the phase, per-replica non-finite counts under tf.distribute,
    and per output of a multi-output model its loss and non-finite counts."""
    row = {**{f: getattr(record, f) for f in STEP_FIELDS}, "phase": record.phase}
    if record.loss_missing:
        row["loss"] = row["data_loss"] = None  # unknown: the step gave no loss, which is not a non-finite one
    if record.replica_nonfinite:
        row["replica_nonfinite"] = list(record.replica_nonfinite)
    if record.worker_nonfinite:
        row["worker_nonfinite"] = list(record.worker_nonfinite)
    if record.outputs:
        row["outputs"] = {name: vars(stats) for name, stats in zip(output_names, record.outputs)}
    return row
