"""Rich rendering of a TraceReport: header, step curves, worst layers, first non-finite, findings."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeAlias

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from nanscope.render.format import compact_table, fitted, fmt, hanging, header, selected_steps, sparkline
from nanscope.render.recommendations import recommendations_panel
from nanscope.render.verdicts import origin_text, reproducible_text

# What the renderer draws is defined above it (report.model, engine.records), and the layers contract keeps render
# from importing upwards, for type checking too: to mypy these are Any.
TraceReport: TypeAlias = Any
StepRecord: TypeAlias = Any

# A name cell's wrapping: `fitted` hands each table builder one.
Wrap = Callable[[str], str]

STATUS_STYLE = {"healthy": "bold green", "warning": "bold yellow", "nonfinite": "bold red"}
WORST_SHOWN = 6


def render_trace_report(report: TraceReport, console: Console, show_all: bool = False) -> None:
    """Print the whole report to a Rich console.

    The layer and variable tables show the WORST_SHOWN first rows and every row the
    findings name, and say how many more there are; `show_all` (`--all`) shows every row.
    """
    console.print(_header(report))
    if report.records:
        console.print(_curves(report))
        console.print(_steps_table(report))
    outputs = report.output_summaries()
    if outputs:
        console.print(_outputs_table(outputs, console))
    if report.layers:
        console.print(_layers_table(report, console, show_all))
    console.print(_variables_table(report, console, show_all))
    if report.first_nonfinite is not None:
        console.print(_first_nonfinite(report))
    console.print(recommendations_panel(report, console))
    for note in report.notes:
        console.print(hanging("note: ", note, style="dim"))
    if report.trace_path:
        console.print(Text(f"trace: {report.trace_path}", style="dim"))


def _header(report: TraceReport) -> Panel:
    run = report.run
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")  # a long path has no space to wrap at: folded, not cut
    optimizer = ", ".join(f"{k}={fmt(v)}" for k, v in run.get("optimizer_config", {}).items())
    rows = [
        ("spec", run.get("spec")),
        ("model", f"{run.get('model')}, {run.get('parameters', 0):,} parameters"),
        ("data", _data_text(run)),
        ("loss", run.get("loss")),
        ("optimizer", f"{run.get('optimizer')}({optimizer})" + _loss_scale_text(report)),
        *_schedule_rows(run),
        ("steps", f"{report.steps_run}"
                  + (f" of {run['steps_requested']}" if run.get("steps_requested") is not None else "")
                  + (" (interrupted)" if report.interrupted else "")
                  + (f" (stopped: {report.stopped})" if report.stopped else "")),
    ]
    if run.get("distribute"):
        rows.append(("distribute", _distribution_text(run["distribute"])))
    if report.validation_loss is not None:
        rows.append(("validation loss", fmt(report.validation_loss)))
    for key, value in rows:
        grid.add_row(key, str(value))
    title = Text.assemble("nanscope trace-steps  ", (report.status.upper(), STATUS_STYLE[report.status]))
    return Panel(grid, title=title, title_align="left")


def _schedule_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The "lr schedule" row under a LearningRateSchedule: its class, its rate at the first and the reported step;
    the "lr changed" row for a constant rate a callback assigned."""
    schedule = run.get("learning_rate_schedule")
    changed = run.get("learning_rate_changed")
    if changed:
        return [("lr changed", f"{fmt(changed.get('start'))} at step 0, {fmt(changed.get('at_step'))} "
                               f"at step {changed.get('step')} (assigned during the run)")]
    if not schedule:
        return []
    at, rate = schedule.get("step"), (run.get("optimizer_config") or {}).get("learning_rate")
    shown = [] if at == 0 or "first_step_learning_rate" not in schedule else [
        f"{fmt(schedule['first_step_learning_rate'])} at step 0"]
    shown.append(f"{fmt(rate)} at step {at}")
    return [("lr schedule", f"{schedule.get('class_name')}: {', '.join(shown)}")]


def _data_text(run: Mapping[str, Any]) -> str:
    """"<data>; train 500 rows, validation 500, batch 32, shuffled", leaving out what the run does not know."""
    parts = [f"train {run['train_rows']} rows" if run.get("train_rows") is not None else None,
             f"validation {run['validation_rows']}" if run.get("validation_rows") is not None else None,
             f"batch {run['batch_size']}" if run.get("batch_size") is not None else None,
             "shuffled" if run.get("shuffle") else None]
    known = ", ".join(part for part in parts if part)
    return f"{run.get('data')}; {known}" if known else str(run.get("data"))


def _loss_scale_text(report: TraceReport) -> str:
    if not report.run.get("loss_scaling"):
        return ""
    seen = report.history.overview() if report.history is not None else None
    now = f", now {fmt(seen.last_loss_scale)}" if seen is not None and seen.last_loss_scale is not None else ""
    skipped = seen.skipped_updates if seen is not None else 0
    return f" with loss scaling ({report.run.get('mixed_precision')}{now}; {skipped} update(s) skipped)"


def _curves(report: TraceReport) -> Panel:
    seen = report.history.overview()
    curves = seen.curves
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_column(style="dim")
    for label, name in (("loss", "loss"), ("grad norm", "grad_global_norm")):
        curve = curves[name]
        if name == "loss" and seen.steps and seen.loss_missing == seen.steps:
            grid.add_row(label, Text("unknown: the step returned no loss", style="yellow"), "")
            continue
        grid.add_row(label, sparkline(curve.points), f"{fmt(curve.first_finite)} -> {fmt(curve.last)}")
    return Panel(grid, title="over steps (log scale; x = non-finite)", title_align="left")


def _steps_table(report: TraceReport) -> Table:
    table = compact_table("selected steps")
    for column in ("step", "loss", "grad norm", "applied norm", "non-finite data/out/grad/weights"):
        table.add_column(header(column), justify="right", no_wrap=True)
    table.add_column("phase")
    first = report.first_nonfinite.step if report.first_nonfinite else None
    for record in selected_steps(report.records, first):
        style = "red" if record.phase else None
        counts = f"{record.x_nonfinite + record.y_nonfinite}/{record.output_nonfinite}/" \
                 f"{record.grad_nonfinite}/{record.weights_nonfinite}"
        loss = "none returned" if record.loss_missing else fmt(record.loss)
        table.add_row(str(record.step), loss, fmt(record.grad_global_norm),
                      fmt(record.applied_grad_global_norm), counts, record.phase or _skipped_text(record), style=style)
    return table


def _skipped_text(record: StepRecord) -> Text | str:
    """The phase cell of a finite step: empty, or the skipped update that loss scaling absorbed."""
    if not record.update_skipped:
        return ""
    scales = f" (scale {record.loss_scale_before or 0:g} -> {record.loss_scale:g})" if record.loss_scale else ""
    return Text("skipped" + scales, style="dim")


def _outputs_table(outputs: Sequence[Mapping[str, Any]], console: Console) -> Table:
    def build(wrap: Wrap) -> Table:
        table = compact_table("outputs (each output's own mean loss)")
        table.add_column("output", no_wrap=True)
        table.add_column("loss", min_width=12)
        for column in ("weight", "first", "last", "NaN steps"):
            table.add_column(header(column), justify="right", no_wrap=True)
        for row in outputs:
            style = "red" if row["nonfinite_steps"] else None
            table.add_row(wrap(row["name"]), row["loss"], fmt(row["weight"]), fmt(row["first_loss"]),
                          fmt(row["last_loss"]), str(row["nonfinite_steps"]), style=style)
        return table

    return fitted(build, [row["name"] for row in outputs], console)


def _shown(rows: list[dict[str, Any]], named: Collection[str], show_all: bool) -> list[dict[str, Any]]:
    """The rows to print, in their order: the first WORST_SHOWN and every named one (all with `show_all`)."""
    if show_all:
        return rows
    return [row for rank, row in enumerate(rows) if rank < WORST_SHOWN or row["name"] in named]


def _caption(table: Table, rows: Sequence[object], shown: Sequence[object], what: str) -> None:
    if len(shown) < len(rows):
        table.caption = f"{len(rows) - len(shown)} more {what} (--all)"
        table.caption_justify = "left"


def _layers_table(report: TraceReport, console: Console, show_all: bool = False) -> Table:
    rows = sorted(report.layer_summaries(), key=lambda r: (-r["nonfinite_steps"], -(r["max_abs"] or 0)))
    shown = _shown(rows, report.named_in_findings()[0], show_all)
    mixed = any(row.get("dtype") not in (None, "float32") for row in rows)

    def build(wrap: Wrap) -> Table:
        table = compact_table("layers (non-finite first, then largest max |x|; mean |x|: last step; zeros: last "
                              "counted)")
        _caption(table, rows, shown, "layers")
        table.add_column("layer", no_wrap=True)
        table.add_column("class", no_wrap=True)
        if mixed:
            table.add_column("dtype", no_wrap=True)
        for column in ("max |x|", "mean |x|", "zeros", "loss term", "NaN steps"):
            table.add_column(header(column) if " " in column and "|" not in column else column, justify="right",
                             no_wrap=True)
        for row in shown:
            style = "red" if row["nonfinite_steps"] else None
            zeros = "" if row["zero_fraction_last"] is None else f"{row['zero_fraction_last']:.0%}"
            cells = [wrap(row["name"]), wrap(row["class"])] + ([row.get("dtype") or "-"] if mixed else [])
            table.add_row(*cells, fmt(row["max_abs"]), fmt(row["mean_abs_last"]), zeros,
                          fmt(row["loss_term_last"]), str(row["nonfinite_steps"]), style=style)
        return table

    return fitted(build, [row["name"] for row in shown] + [row["class"] for row in shown], console)


def _variables_table(report: TraceReport, console: Console, show_all: bool = False) -> Table:
    rows = sorted(report.variable_summaries(), key=lambda r: (-r["nonfinite_steps"], -(r["max_grad_norm"] or 0)))
    shown = _shown(rows, report.named_in_findings()[1], show_all)

    def build(wrap: Wrap) -> Table:
        table = compact_table("variables (non-finite first, then largest max grad; |w|: last step)")
        _caption(table, rows, shown, "variables")
        table.add_column("variable", no_wrap=True)
        for column in ("max grad", "last grad", "max |dw|/|w|", "|w|", "NaN steps"):
            table.add_column(header(column) if "|" not in column else column, justify="right", no_wrap=True)
        for row in shown:
            style = "red" if row["nonfinite_steps"] else None
            table.add_row(wrap(row["name"]), fmt(row["max_grad_norm"]), fmt(row["last_grad_norm"]),
                          fmt(row["max_update_ratio"]), fmt(row["weight_norm_last"]), str(row["nonfinite_steps"]),
                          style=style)
        return table

    return fitted(build, [row["name"] for row in shown], console)


def _first_nonfinite(report: TraceReport) -> Panel:
    first = report.first_nonfinite
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    layer = f"{first.layer} ({first.layer_class})" if first.layer_class else first.layer
    for key, value in (("step", first.step), ("phase", first.phase), ("worker", _worker_text(report)),
                       ("replica", _replica_text(report)), ("output", first.output), ("loss", first.loss),
                       ("layer", layer), ("variable", first.variable), ("op", first.op), ("source", first.source)):
        if value is not None:
            grid.add_row(key, str(value))
    if first.inputs:
        stats = {k: v for k, v in first.inputs.items() if k not in ("op", "operand", "dtype")}
        label = f"{first.inputs.get('op', first.op)} {first.inputs.get('operand', 'input')}"
        grid.add_row(label, ", ".join(f"{k} {fmt(v)}" for k, v in stats.items())
                     + f" ({first.inputs.get('dtype', '')})")
    for line in first.detail:
        grid.add_row("", line)
    for key, verdict in (("reproducible", reproducible_text(first)), ("origin", origin_text(first))):
        if verdict is not None:
            grid.add_row(key, verdict)
    return Panel(grid, title="first non-finite value", title_align="left", border_style="red")


def _distribution_text(distribute: Mapping[str, Any]) -> str:
    """"MirroredStrategy, 2 replicas" or "MultiWorkerMirroredStrategy, 2 workers x 2 replicas"."""
    if distribute.get("workers"):
        workers, replicas = distribute["workers"], distribute["replicas_per_worker"]
        return f"{distribute['strategy']}, {workers} workers x {replicas} replicas"
    return f"{distribute['strategy']}, {distribute['replicas']} replicas"


def _replica_text(report: TraceReport) -> str | None:
    """"1 (non-finite values per replica: 0, 12)" under tf.distribute; None on one device."""
    first = report.first_nonfinite
    if first.replica is None:
        return None
    record = report.history.record_at(first.step) if report.history is not None else None
    counts = f" (non-finite values per replica: {', '.join(map(str, record.replica_nonfinite))})" if record else ""
    return f"{first.replica}{counts}"


def _worker_text(report: TraceReport) -> str | None:
    """"1 (non-finite values per worker: 0, 12)" under MultiWorkerMirroredStrategy; None otherwise."""
    first = report.first_nonfinite
    if getattr(first, "worker", None) is None:
        return None
    record = report.history.record_at(first.step) if report.history is not None else None
    counts = f" (non-finite values per worker: {', '.join(map(str, record.worker_nonfinite))})" if record else ""
    return f"{first.worker}{counts}"


def render_replay(report: TraceReport, console: Console) -> None:
    """Print a replayed step: the first-non-finite panel and the recommendations."""
    if report.first_nonfinite is not None:
        console.print(_first_nonfinite(report))
    console.print(recommendations_panel(report, console))
    for note in report.notes:
        console.print(hanging("note: ", note, style="dim"))
