"""Rich output for check-data: a table per input and target array, the label checks, the recommendations.

Also `scan_progress`, the progress bar on stderr that only appears when a scan runs
for more than a second. Renderers format what the scan measured; they never compute.
"""

import time
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_ROWS_SHOWN = 40


def render_data_report(scan, console):
    """Print a DataScan: header, one table per array, the label check of each output, recommendations, status line."""
    sampled = f" (sample of {scan.scanned_rows})" if scan.sampled else ""
    console.print(f"check-data {scan.source}: {scan.description}{sampled}", style="bold", markup=False)
    for role, columns in (("input", scan.inputs), ("target", scan.targets)):
        for array in dict.fromkeys(c.array for c in columns):
            in_array = [c for c in columns if c.array == array]
            console.print(_column_table(_array_title(role, array, in_array[0].output), in_array))
    for labels in scan.label_checks or ([scan.labels] if scan.labels is not None else []):
        _print_labels(labels, console)
    for rec in scan.recommendations:
        style = SEVERITY_STYLE.get(rec.severity, "")
        console.print(f"[{style}]{rec.severity}[/{style}] [bold]{rec.id}[/bold]: {rec.title}")
        for line in rec.evidence:
            console.print(f"    {line}", markup=False, highlight=False)
        console.print(f"    fix: {rec.fix}", style="dim", markup=False, highlight=False)
    colour = "green" if scan.status == "clean" else "red"
    console.print(f"status: [{colour}]{scan.status}[/{colour}]")


def _array_title(role, array, output):
    if output is None or str(output) == array:
        return f"{role} {array}"
    return f"{role} {array} (output {output})"


def _column_table(title, columns):
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("column", no_wrap=True)
    for header in ("NaN", "+Inf", "-Inf", "min", "max", "mean", "std", "zeros"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("notes", overflow="fold", min_width=10, ratio=1)
    shown = _worth_showing(columns)
    for c in shown:
        style = "red" if c.is_problem else "yellow" if c.scale else "dim" if c.constant or c.allowed_nonfinite else ""
        table.add_row(
            c.name, str(c.nan), str(c.posinf), str(c.neginf), _num(c.min), _num(c.max), _num(c.mean),
            _num(c.std), f"{c.zeros:.0%}", _notes(c), style=style,
        )
    if len(shown) < len(columns):
        table.caption = f"{len(columns) - len(shown)} more columns without problems not shown (see --json)"
    return table


def _notes(column):
    notes = []
    if column.nonfinite:
        rows = ", ".join(map(str, column.first_nonfinite_rows))
        notes.append(("allowed; " if column.allowed_nonfinite else "") + f"rows {rows}")
    if column.constant:
        notes.append("constant")
    if column.scale:
        notes.append(f"{column.scale} scale")
    return "; ".join(notes)


def _worth_showing(columns):
    if len(columns) <= MAX_ROWS_SHOWN:
        return columns
    flagged = [c for c in columns if c.nonfinite or c.scale or c.constant]
    rest = [c for c in columns if c not in flagged]
    return (flagged + rest)[:MAX_ROWS_SHOWN]


def _print_labels(labels, console):
    classes = labels.classes if labels.classes is not None else "unknown"
    output = "" if labels.output is None else f" of output {labels.output}"
    console.print(f"[bold]labels[/bold]{escape(f'{output} for {labels.loss} ({labels.kind}, classes: {classes})')}",
                  highlight=False)
    counts = ", ".join(f"{k}: {n}" for k, n in list(labels.class_counts.items())[:20])
    if counts:
        console.print(f"    class counts: {counts}", highlight=False)
    for problem in labels.problems:
        console.print(f"    {problem} (first rows {labels.first_bad_rows})", style="red", markup=False)


def _num(value):
    return f"{value:.3g}"


@contextmanager
def scan_progress(stderr=True, delay_s=1.0):
    """A progress callback for `scan_data` that shows a Rich bar on stderr once a scan passes `delay_s`."""
    console = Console(stderr=stderr)
    started = time.monotonic()
    state = {"progress": None, "task": None}

    def on_progress(done, total):
        if state["progress"] is None:
            if time.monotonic() - started < delay_s or not console.is_terminal:
                return
            state["progress"] = Progress(
                SpinnerColumn(), TextColumn("scanning rows"), BarColumn(), TextColumn("{task.completed:,} rows"),
                TimeElapsedColumn(), console=console, transient=True,
            )
            state["progress"].start()
            state["task"] = state["progress"].add_task("scan", total=total)
        state["progress"].update(state["task"], completed=done, total=total)

    try:
        yield on_progress
    finally:
        if state["progress"] is not None:
            state["progress"].stop()
