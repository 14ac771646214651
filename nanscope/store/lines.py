"""The trace file's line kinds, one class each: what the line holds, `to_json` and `from_json`.

A trace (`nanscope.store.tracefile`) is JSON lines. The first is the `header` (what was run, the
layers and variables, how the steps are laid out); then `scalars` lines (every step's scalar row, a
few steps a line), `step` lines (the full record of a kept step) and `error` lines as the run makes
them; at the end the `aggregates` line (the exact per-layer, per-variable and per-output tables) and
the `summary` (what the run found). The header's `schema` names the version of these kinds
(TRACE_SCHEMA). A reader takes a line of a kind it does not know as a plain dict and goes on, and a
field a class does not know stays out of it: a trace written by an older or newer nanscope still loads.
NaN and Inf are spelled "nan", "inf", "-inf" (`nanscope.jsonio`), and read back by `from_json`.

Example:
    text = dumps(ErrorLine(step=7, message="...").to_json(), indent=None)
    line = parse_line(json.loads(text))   # an ErrorLine again
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nanscope.engine.records import LayerStats, OutputStats, StepRecord, VariableStats, record_from_dict
from nanscope.engine.schema import PHASES
from nanscope.jsonio import decode_float, encode_float, jsonable
from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE
from nanscope.store.aggregates import LayerAggregate, OutputAggregate, VariableAggregate

TRACE_SCHEMA = "nanscope.trace-lines/1"


@dataclass
class HeaderLine:
    """The first line: the run description, the layers and variables, and how the steps are written.

    Args:
        run: dict. The run header (`nanscope.report.header.run_header`).
        layers: list of [name, class]. The probed layers, in row order.
        layer_order: list. The layers' order in the model, for the tables.
        variables: list of str. The trainable variables, in row order.
        rows: str, default "full". "full": every step has a `step` line; "kept": `scalars` lines for every step
            and `step` lines for the kept steps (a trace written before scalars lines existed reads "full").
        series: list of str, optional. With "kept": the scalars lines' columns, starting with "step".
        phases: list, optional. The phase of each number in the "phase" column.
        keep, sample: int. The run's StepHistory bounds (DEFAULT_KEEP, DEFAULT_SAMPLE).
        schema: str, default TRACE_SCHEMA.
    """

    KIND: ClassVar[str] = "header"
    run: Any = field(default_factory=dict)
    layers: Any = field(default_factory=list)
    layer_order: Any = field(default_factory=list)
    variables: Any = field(default_factory=list)
    rows: Any = "full"
    series: Any = None
    phases: Any = None
    keep: Any = DEFAULT_KEEP
    sample: Any = DEFAULT_SAMPLE
    schema: Any = TRACE_SCHEMA

    @classmethod
    def for_run(cls, header: dict, history: Any = None, full: bool = False) -> "HeaderLine":
        """The header of a run's trace: `header` (TraceReport.trace_header) and the layout `history` gives."""
        if full or history is None:
            return cls(**header)
        return cls(**header, rows="kept", series=["step", *history.series.columns], phases=list(PHASES),
                   keep=history.keep, sample=history.sample_size)

    def to_json(self) -> dict:
        layout = ({"rows": "full"} if self.rows == "full" else
                  {"rows": self.rows, "series": self.series, "phases": self.phases, "keep": self.keep,
                   "sample": self.sample})
        return {"kind": self.KIND, "schema": self.schema, "run": self.run, "layers": self.layers,
                "layer_order": self.layer_order, "variables": self.variables, **layout}

    @classmethod
    def from_json(cls, line: dict) -> "HeaderLine":
        known = ("run", "layers", "layer_order", "variables", "rows", "series", "phases", "keep", "sample", "schema")
        return cls(**{name: line[name] for name in known if name in line})


@dataclass
class StepLine:
    """A kept step's full record; `kept` says why the run kept it (StepHistory.why_kept), in a trace of kept rows."""

    KIND: ClassVar[str] = "step"
    record: StepRecord
    kept: str | None = None

    def to_json(self) -> dict:
        line = {"kind": self.KIND, **vars(self.record), "phase": self.record.phase}
        if self.kept is not None:
            line["kept"] = self.kept
        return line

    @classmethod
    def from_json(cls, line: dict) -> "StepLine":
        """Raises TypeError, ValueError, KeyError or AttributeError for a line that is not a step record."""
        return cls(record_from_dict(line), line.get("kept"))


@dataclass
class ScalarsLine:
    """Every step's scalar row, a few steps a line: each row is [step, *values] in the header's `series` order."""

    KIND: ClassVar[str] = "scalars"
    rows: list

    def to_json(self) -> dict:
        return {"kind": self.KIND, "rows": [[v if isinstance(v, int) else encode_float(float(v)) for v in row]
                                            for row in self.rows]}

    @staticmethod
    def text(encoded_rows: list[str]) -> str:
        """The line as the writer makes it from rows already encoded ("[step,v1,v2,...]"), without a dict between."""
        return '{"kind":"scalars","rows":[' + ",".join(encoded_rows) + "]}"

    @classmethod
    def from_json(cls, line: dict) -> "ScalarsLine":
        return cls(line.get("rows", []))


@dataclass
class ErrorLine:
    """The run stopped on an error at `step`: a collective that failed, a stop the guard made, ..."""

    KIND: ClassVar[str] = "error"
    step: int | None
    message: str

    def to_json(self) -> dict:
        return {"kind": self.KIND, "step": self.step, "message": self.message}

    @classmethod
    def from_json(cls, line: dict) -> "ErrorLine":
        return cls(line.get("step"), str(line.get("message", "")))


@dataclass
class AggregatesLine:
    """The exact per-layer, per-variable and per-output aggregates of the whole run, and the sample's last stride
    (which the redraw takes, so that it keeps the run's rows)."""

    KIND: ClassVar[str] = "aggregates"
    layers: list
    variables: list
    outputs: list
    sample_stride: int | None = None

    @classmethod
    def of(cls, history: Any) -> "AggregatesLine":
        """The aggregates of a StepHistory."""
        return cls(history.layers, history.variables, history.outputs, history.sample_stride)

    def to_json(self) -> dict:
        return jsonable({"kind": self.KIND, "layers": self.layers, "variables": self.variables,
                         "outputs": self.outputs, "sample_stride": self.sample_stride})

    @classmethod
    def from_json(cls, line: dict) -> "AggregatesLine":
        return cls([_aggregate(LayerAggregate, row, LayerStats) for row in line.get("layers", [])],
                   [_aggregate(VariableAggregate, row, VariableStats) for row in line.get("variables", [])],
                   [_aggregate(OutputAggregate, row, OutputStats, ("first", "last"))
                    for row in line.get("outputs", [])],
                   line.get("sample_stride"))


def _aggregate(cls: type[Any], row: dict[str, Any], stats_cls: type[Any],
               stats_fields: tuple[str, ...] = ("last",)) -> Any:
    values = {k: decode_float(v) for k, v in row.items()}
    for name in stats_fields:
        if values.get(name) is not None:
            values[name] = stats_cls(**{k: decode_float(v) for k, v in values[name].items()})
    return cls(**values)


@dataclass
class SummaryLine:
    """The last line: what the run found and how it ended.

    Args:
        first_nonfinite: dict, optional. The first non-finite step (`nanscope.report.model.FirstNonfinite`).
        recommendations: list of dict. The findings, ranked.
        interventions, spikes: list of dict. What the guard did; the loss spikes it saw.
        validation_loss: float, optional.
        interrupted: bool. The run was stopped by a signal.
        notes: list of str.
        stopped: str, optional. Why the run stopped early, when it did.
        run: dict, optional. What the run header learned only at the end (a schedule's rate at the reported step).
    """

    KIND: ClassVar[str] = "summary"
    first_nonfinite: Any = None
    recommendations: list = field(default_factory=list)
    interventions: list = field(default_factory=list)
    spikes: list = field(default_factory=list)
    validation_loss: Any = None
    interrupted: bool = False
    notes: list = field(default_factory=list)
    stopped: str | None = None
    run: dict = field(default_factory=dict)

    @classmethod
    def of(cls, report: Any) -> "SummaryLine":
        """The summary of a TraceReport."""
        return cls(first_nonfinite=report.first_nonfinite, recommendations=report.recommendations,
                   interventions=getattr(report, "interventions", []), spikes=getattr(report, "spikes", []),
                   validation_loss=report.validation_loss, interrupted=report.interrupted, notes=report.notes,
                   stopped=getattr(report, "stopped", None), run=_settled_run(report.run))

    def to_json(self) -> dict:
        line = {"kind": self.KIND, "first_nonfinite": self.first_nonfinite, "interventions": self.interventions,
                "spikes": self.spikes, "recommendations": self.recommendations,
                "validation_loss": self.validation_loss, "interrupted": self.interrupted, "notes": self.notes}
        if self.stopped:
            line["stopped"] = self.stopped
        if self.run:
            line["run"] = self.run
        return jsonable(line)

    @classmethod
    def from_json(cls, line: dict) -> "SummaryLine":
        known = ("first_nonfinite", "recommendations", "interventions", "spikes", "validation_loss", "interrupted",
                 "notes", "stopped", "run")
        return cls(**{name: line[name] for name in known if name in line})


def _settled_run(run: dict[str, Any]) -> dict[str, Any]:
    """What the run header learns only when the run ends (a schedule's rate at the reported step), for the summary:
    the header line was written when the run started."""
    if not (run or {}).get("learning_rate_schedule"):
        return {}
    return {"optimizer_config": run.get("optimizer_config"), "learning_rate_schedule": run["learning_rate_schedule"]}


LINE_KINDS = {cls.KIND: cls for cls in (HeaderLine, StepLine, ScalarsLine, ErrorLine, AggregatesLine, SummaryLine)}


def parse_line(line: dict) -> Any:
    """The line's class (`LINE_KINDS`) built from its JSON; a line of a kind this version does not know, as it is."""
    kind = LINE_KINDS.get(str(line.get("kind")))
    return kind.from_json(line) if kind is not None else line
