"""Rich output for check-data: a table per input and target array, the label checks, the recommendations.

Also `scan_progress`, the progress bar on stderr that only appears when a scan runs
for more than a second. Renderers format what the scan measured; they never compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from nanscope.render.format import fitted, hanging

# What the renderer draws is defined above it (checkdata), and the layers contract keeps render from importing
# upwards, for type checking too: to mypy these are Any.
DataScan: TypeAlias = Any
ColumnStats: TypeAlias = Any
LabelCheck: TypeAlias = Any

# A name cell's wrapping: `fitted` hands each table builder one.
Wrap = Callable[[str], str]

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_ROWS_SHOWN = 40


def render_data_report(scan: DataScan, console: Console, show_all: bool = False) -> None:
    """Print a DataScan: header, one table per array, the label check of each output, recommendations, status line.

    A table of more than MAX_ROWS_SHOWN columns shows the flagged ones first and says how
    many more there are, flagged or not; `show_all` (`--all`) shows every column.
    """
    sampled = f" (sample of {scan.scanned_rows})" if scan.sampled else ""
    console.print(f"check-data {scan.source}: {scan.description}{sampled}", style="bold", markup=False)
    for role, columns in (("input", scan.inputs), ("target", scan.targets)):
        for array in dict.fromkeys(c.array for c in columns):
            in_array = [c for c in columns if c.array == array]
            console.print(_column_table(_array_title(role, array, in_array[0].output), in_array, console, show_all))
    for labels in scan.label_checks or ([scan.labels] if scan.labels is not None else []):
        _print_labels(labels, console)
    for rec in scan.recommendations:
        style = SEVERITY_STYLE.get(rec.severity, "")
        console.print(f"[{style}]{rec.severity}[/{style}] [bold]{rec.id}[/bold]: {rec.title}")
        for line in rec.evidence:
            console.print(hanging("    ", Text(line)))
        console.print(hanging("    fix: ", Text(rec.fix), style="dim"))
    colour = "green" if scan.status == "clean" else "red"
    console.print(f"status: [{colour}]{scan.status}[/{colour}]")


def _array_title(role: str, array: str, output: object) -> str:
    if output is None or str(output) == array:
        return f"{role} {array}"
    return f"{role} {array} (output {output})"


def _column_table(title: str, columns: Sequence[ColumnStats], console: Console, show_all: bool = False) -> Table:
    shown = columns if show_all else _worth_showing(columns)

    # Numbers never wrap or get cut; names break only after _ . / - (render.format.name_lines), notes at spaces.
    def build(wrap: Wrap) -> Table:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                      collapse_padding=True)
        table.add_column("column", no_wrap=True)
        for column in ("NaN/\n+Inf/\n-Inf", "min", "max", "mean", "std", "zeros"):
            table.add_column(column, justify="right", no_wrap=True)
        table.add_column("notes", min_width=8)
        for c in shown:
            style = ("red" if c.is_problem else "yellow" if c.scale
                     else "dim" if c.constant or c.allowed_nonfinite else "")
            table.add_row(
                wrap(c.name), f"{c.nan}/{c.posinf}/{c.neginf}", _num(c.min), _num(c.max), _num(c.mean),
                _num(c.std), f"{c.zeros:.0%}", _notes(c), style=style,
            )
        table.caption = _hidden_caption([c for c in columns if c not in shown])
        return table

    return fitted(build, [c.name for c in shown], console)


def _hidden_caption(hidden: Sequence[ColumnStats]) -> str | None:
    """What the columns left out hold, as the JSON does: "24 more columns, 24 of them flagged (large scale) (--all)"."""
    if not hidden:
        return None
    tests = {"non-finite": lambda c: c.is_problem, "large scale": lambda c: c.scale == "large",
             "small scale": lambda c: c.scale == "small", "constant": lambda c: c.constant}
    kinds = {kind: sum(1 for c in hidden if test(c)) for kind, test in tests.items()}
    flagged = sum(1 for c in hidden if _flagged(c))
    if not flagged:
        return f"{len(hidden)} more columns without problems (--all)"
    what = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n)
    return f"{len(hidden)} more columns, {flagged} of them flagged: {what} (--all)"


def _flagged(column: ColumnStats) -> bool:
    return bool(column.nonfinite or column.scale or column.constant)


def _notes(column: ColumnStats) -> str:
    notes = []
    if column.nonfinite:
        rows = ", ".join(map(str, column.first_nonfinite_rows))
        notes.append(("allowed; " if column.allowed_nonfinite else "") + f"rows {rows}")
    if column.constant:
        notes.append("constant")
    if column.scale:
        notes.append(f"{column.scale} scale")
    return "; ".join(notes)


def _worth_showing(columns: Sequence[ColumnStats]) -> Sequence[ColumnStats]:
    if len(columns) <= MAX_ROWS_SHOWN:
        return columns
    flagged = sorted((c for c in columns if _flagged(c)), key=lambda c: not c.is_problem)  # problems first
    rest = [c for c in columns if c not in flagged]
    return (flagged + rest)[:MAX_ROWS_SHOWN]


def _print_labels(labels: LabelCheck, console: Console) -> None:
    classes = labels.classes if labels.classes is not None else "unknown"
    output = "" if labels.output is None else f" of output {labels.output}"
    console.print(f"[bold]labels[/bold]{escape(f'{output} for {labels.loss} ({labels.kind}, classes: {classes})')}",
                  highlight=False)
    counts = ", ".join(f"{k}: {n}" for k, n in list(labels.class_counts.items())[:20])
    if counts:
        console.print(f"    class counts: {counts}", highlight=False)
    for problem, rows in zip(labels.problems, labels.problem_rows):
        console.print(f"    {problem} (first rows {rows})", style="red", markup=False)


def _num(value: float) -> str:
    return f"{value:.3g}"


@contextmanager
def scan_progress(stderr: bool = True, delay_s: float = 1.0) -> Iterator[Callable[[int, int], None]]:
    """A progress callback for `scan_data` that shows a Rich bar on stderr once a scan passes `delay_s`."""
    console = Console(stderr=stderr)
    started = time.monotonic()
    state: dict[str, Any] = {"progress": None, "task": None}

    def on_progress(done: int, total: int) -> None:
        if state["progress"] is None:
            if time.monotonic() - started < delay_s or not console.is_terminal:
                return
            state["progress"] = Progress(
                SpinnerColumn(), TextColumn("scanning rows"), BarColumn(), TextColumn("{task.completed:,} rows"),
                TimeElapsedColumn(), console=console, transient=True,
            )
            state["progress"].start()  # type: ignore[attr-defined]  # mypy keeps the `is None` narrowing
            state["task"] = state["progress"].add_task("scan", total=total)  # type: ignore[attr-defined]
        state["progress"].update(state["task"], completed=done, total=total)

    try:
        yield on_progress
    finally:
        if state["progress"] is not None:
            state["progress"].stop()
