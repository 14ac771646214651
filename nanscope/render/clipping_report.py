"""Rich output for compare-clipping: one row per strategy, loss curves, the verdict.

Also `clipping_progress`, the progress bar on stderr while strategies train.
Renderers format what the comparison measured; they never compute and never write
files (the `--plot` image is drawn by `nanscope.report.plotting`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from nanscope.render.format import fitted, fmt, hanging, sparkline

# What the renderer draws is defined above it (clipping.compare, experiment), and the layers
# contract keeps render from importing upwards, for type checking too: to mypy these are Any.
ClippingReport: TypeAlias = Any
StrategyRun: TypeAlias = Any
ExperimentResult: TypeAlias = Any

# A name cell's wrapping: `fitted` hands each table builder one.
Wrap = Callable[[str], str]

CURVE_WIDTH = 16


def render_clipping_report(report: ClippingReport, console: Console) -> None:
    """Print a ClippingReport: header, the strategy table, how thresholds were chosen, the verdict."""
    run = report.run
    console.print(Text.assemble(
        ("nanscope compare-clipping  ", "bold"), f"{run.get('spec')}: {run.get('model')}, "
        f"{run.get('parameters', 0):,} parameters; {run.get('steps')} steps per strategy, "
        f"batch {run.get('batch_size')}, "
        f"same initial weights and batch order for all",
    ))
    console.print(_outcome_table(report, console))
    console.print(_clipping_table(report, console))
    console.print(Text("took effect: on every step where the threshold bit, the gradient the update used was within "
                       "it; Δw: the optimizer's real first update matched Keras' documented clipping", style="dim"))
    if report.baseline is not None:
        console.print(Text(f"trivial baseline: {fmt(report.baseline.value)} on the {report.baseline.rows} rows, "
                           f"{report.baseline.how}; a strategy must end below it to be recommended", style="dim"))
    if report.thresholds:
        console.print(Text(f"thresholds not given: G = {report.thresholds['global_norm_bound']:g}, "
                           f"{report.thresholds['how']}; see the why of each strategy", style="dim"))
        if _auto_without_percentile(report):
            console.print(Text(f"auto (G): AutoClip's percentile needs at least "
                               f"{report.thresholds['auto_min_healthy_steps']} healthy steps, the unclipped run had "
                               f"{report.thresholds['healthy_steps']}; auto clips at G instead", style="yellow"))
    console.print(_verdict(report))
    for note in report.notes:
        console.print(hanging("note: ", note, style="dim"))


def _table(title: str) -> Table:
    """A table that fits 80 columns: thin gaps, headers on two lines, names that fold, numbers that never do."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)


def _name_cell(run: StrategyRun, report: ClippingReport, wrap: Wrap) -> Text:
    recommended = run.strategy.name == report.recommended
    return Text(wrap(run.strategy.name + (" *" if recommended else "")), style="bold green" if recommended else "")


def _names(report: ClippingReport) -> list[str]:
    return [run.strategy.name + " *" for run in report.runs]


def _outcome_table(report: ClippingReport, console: Console) -> Table:
    """Per strategy: where it went non-finite, its losses and its loss curve."""
    scaled = any(run.result.skipped_updates for run in report.runs)

    def build(wrap: Wrap) -> Table:
        table = _table("strategies (* recommended; loss curve: log scale, x = non-finite)")
        table.add_column("strategy", no_wrap=True)
        for header in ("NaN\nat",) + (("skipped\nupdates",) if scaled else ()) + ("final\nloss", "best\nloss",
                                                                                  "val\nloss"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("loss curve", no_wrap=True)
        for run in report.runs:
            result = run.result
            skipped = (_skipped_cell(result),) if scaled else ()
            table.add_row(
                _name_cell(run, report, wrap),
                Text(fmt(result.first_nonfinite_step), style="red") if not result.finite else "-",
                *skipped, fmt(result.final_loss), fmt(result.best_loss), fmt(result.val_loss),
                sparkline(result.losses, width=CURVE_WIDTH),
            )
        if scaled:
            table.caption = ("skipped updates: the LossScaleOptimizer's scaled gradients overflowed float16 and it "
                             "skipped the update; not a failure (stalled: so many that the run did not train)")
            table.caption_justify = "left"
        return table

    return fitted(build, _names(report), console)


def _skipped_cell(result: ExperimentResult) -> Text | str:
    text = str(result.skipped_updates)
    return Text(text + " stalled", style="red") if result.stalled else text


def _clipping_table(report: ClippingReport, console: Console) -> Table:
    """Per strategy: its threshold, how often it clipped, how much it removed, and whether it took effect."""
    def build(wrap: Wrap) -> Table:
        table = _table("clipping (clipped: share of steps; removed: share of the gradient norm)")
        table.add_column("strategy", no_wrap=True)
        for header in ("threshold", "clipped", "removed"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("took\neffect", no_wrap=True)
        for run in report.runs:
            effect = run.effect
            threshold = fmt(run.strategy.threshold)
            if run.strategy.kind == "auto" and _auto_without_percentile(report):
                threshold += " (G)"
            table.add_row(_name_cell(run, report, wrap), threshold, _percent(effect.clipped_fraction),
                          _percent(effect.norm_removed), _took_effect(run))
        return table

    return fitted(build, _names(report), console)


def _auto_without_percentile(report: ClippingReport) -> bool:
    """True when `auto` had too few healthy steps for its percentile and clips at G."""
    return report.thresholds.get("auto_from", "percentile") != "percentile" and any(
        run.strategy.kind == "auto" and run.strategy.threshold_source != "given" for run in report.runs)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _took_effect(run: StrategyRun) -> Text | str:
    if run.took_effect is None:
        return "-" if run.strategy.kind == "none" else "never bit"
    if run.took_effect is False:
        return Text("NO", style="bold red")
    return Text("yes" + (", Δw" if run.optimizer_check is not None else ""), style="green")


def _verdict(report: ClippingReport) -> Panel:
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
    parts: list[RenderableType] = [Text.assemble(("use ", "bold"), (best["name"], "bold green"))]
    parts.extend(hanging("  - ", line) for line in best["why"])
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
def clipping_progress() -> Iterator[Callable[[str, int, int], None] | None]:
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

    def on_progress(name: str, done: int, total: int) -> None:
        progress.update(task, completed=done, total=total, description=f"training {name}")

    with progress:
        yield on_progress
