"""Rich output for compare-clipping: one row per strategy, loss curves, the verdict.

Also `clipping_progress`, the progress bar on stderr while strategies train.
Renderers format what the comparison measured; they never compute and never write
files (the `--plot` image is drawn by `nanscope.plotting`).
"""

from contextlib import contextmanager

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from nanscope.render.format import fmt, sparkline

CURVE_WIDTH = 20
# Tables are not wrapped when the output is not a terminal (a pipe, a file, a test).
PIPE_WIDTH = 160


def render_clipping_report(report, console):
    """Print a ClippingReport: header, the strategy table, how thresholds were chosen, the verdict."""
    run = report.run
    console.print(Text.assemble(
        ("nanscope compare-clipping  ", "bold"), f"{run.get('spec')}: {run.get('model')}, "
        f"{run.get('parameters', 0):,} parameters; {run.get('steps')} steps per strategy, "
        f"batch {run.get('batch_size')}, "
        f"same initial weights and batch order for all",
    ))
    _print_unwrapped(console, _strategies_table(report))
    console.print(Text("took effect: on every step where the threshold bit, the gradient the update used was within "
                       "it; Δw: the optimizer's real first update matched Keras' documented clipping", style="dim"))
    if report.baseline is not None:
        console.print(Text(f"trivial baseline: {fmt(report.baseline.value)} on the {report.baseline.rows} rows, "
                           f"{report.baseline.how}; a strategy must end below it to be recommended", style="dim"))
    if report.thresholds:
        console.print(Text(f"thresholds not given: G = {report.thresholds['global_norm_bound']:g}, "
                           f"{report.thresholds['how']}; see the why of each strategy", style="dim"))
    console.print(_verdict(report))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="dim"))


def _print_unwrapped(console, renderable):
    """Print at least PIPE_WIDTH wide when the output is not a terminal, so a table keeps its columns."""
    if console.is_terminal or console.width >= PIPE_WIDTH:
        console.print(renderable)
        return
    width = console.width
    console.width = PIPE_WIDTH
    try:
        console.print(renderable)
    finally:
        console.width = width


def _strategies_table(report):
    table = Table(title="strategies (loss curve: log scale, x = non-finite)", title_justify="left", show_edge=False)
    for column in ("strategy", "threshold", "NaN at", "final loss", "best loss", "val loss", "clipped",
                   "removed", "took effect", "loss curve"):
        table.add_column(column, justify="left" if column in ("strategy", "loss curve", "took effect") else "right",
                         no_wrap=True)
    for run in report.runs:
        result, effect = run.result, run.effect
        recommended = run.strategy.name == report.recommended
        table.add_row(
            Text(run.strategy.name + (" *" if recommended else ""), style="bold green" if recommended else None),
            fmt(run.strategy.threshold),
            Text(fmt(result.first_nonfinite_step), style="red") if not result.finite else "-",
            fmt(result.final_loss), fmt(result.best_loss), fmt(result.val_loss),
            _percent(effect.clipped_fraction), _percent(effect.norm_removed),
            _took_effect(run), sparkline(result.losses, width=CURVE_WIDTH),
        )
    return table


def _percent(value):
    return "-" if value is None else f"{value:.0%}"


def _took_effect(run):
    if run.took_effect is None:
        return "-" if run.strategy.kind == "none" else "never bit"
    if run.took_effect is False:
        return Text("NO", style="bold red")
    return Text("yes" + (", Δw" if run.optimizer_check is not None else ""), style="green")


def _verdict(report):
    if report.recommended is None and report.interrupted and not report.runs:
        return Panel(Text("interrupted before any strategy finished", style="red"),
                     title=Text("verdict: none", style="bold red"), title_align="left")
    if report.recommended is None:
        title = ("verdict: clipping only hides the problem" if report.hides_problem
                 else "verdict: interrupted, no strategy to recommend" if report.interrupted
                 else "verdict: no clipping strategy fixes this run")
        return Panel(Text(report.diagnosis or "no strategy stayed finite", style="red"),
                     title=Text(title, style="bold red"), title_align="left")
    best = report.recommendations[0]
    parts = [Text.assemble(("use ", "bold"), (best["name"], "bold green"))]
    parts.extend(Text(f"  - {line}") for line in best["why"])
    parts.append(Text("run spec:", style="bold"))
    parts.append(Syntax(best["yaml"], "yaml", theme="ansi_dark", background_color="default", word_wrap=True))
    if best.get("code"):
        parts.append(Text("in a training script:", style="bold"))
        parts.append(Syntax(best["code"], "python", theme="ansi_dark", background_color="default", word_wrap=True))
    others = [f"{rec['name']} ({rec['metric']} {fmt(rec['value'])})" for rec in report.recommendations[1:]]
    if others:
        parts.append(Text(f"also finite: {', '.join(others)}", style="dim"))
    return Panel(Group(*parts), title=Text("verdict", style="bold"), title_align="left")


@contextmanager
def clipping_progress():
    """A progress callback for `compare_clipping`: a Rich bar on stderr, shown only on a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )
    task = progress.add_task("training", total=None)

    def on_progress(name, done, total):
        progress.update(task, completed=done, total=total, description=f"training {name}")

    with progress:
        yield on_progress
