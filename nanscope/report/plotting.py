"""Plots of a run (`nanscope[plot]`): loss, gradient norm and the worst layers over steps.

matplotlib is an optional extra; `require_matplotlib()` turns its absence into one
line and exit code 2 before any training starts. Figures are drawn with the Agg
backend, so no display is needed. Non-finite points are left out of the curves and
marked with red x's along the top of each panel.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.engine.records import StepRecord
from nanscope.store.history import StepHistory
from nanscope.errors import NanscopeError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

    from nanscope.report.model import TraceReport

WORST_LAYERS = 4


def require_matplotlib(option: str = "--plot") -> None:
    """Fail fast when a plot is asked for and matplotlib is missing.

    Raises:
        NanscopeError: one line naming the option and the extra to install (exit 2).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NanscopeError(f"`{option}` needs matplotlib, which is not installed; "
                            "pip install 'nanscope[plot]'") from None


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_trace(report: TraceReport, path: str | os.PathLike[str]) -> None:
    """Write loss, gradient norm and the worst layers' max |x| over steps to an image file.

    A multi-output model's per-output losses are drawn beside the total loss.

    The first non-finite step is a red line; the onset of gradient growth found by the
    `clip-gradients` rule, when it fired, is an orange dashed line.

    Args:
        report: TraceReport.
        path: str or Path. The image file (its suffix picks the format: .png, .svg, .pdf).
    """
    plt = _pyplot()
    # Every step's scalars; the layers' curves are drawn through the kept full rows.
    history: StepHistory = report.history  # type: ignore[assignment]  # a report to plot has its history
    steps = history.steps().tolist()
    figure, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    _curve(axes[0], steps, history.column("loss").tolist(), "loss")
    for index, name in enumerate(report.output_names if report.output_summaries() else []):
        _curve(axes[0], steps, history.column(f"output{index}/loss").tolist(), f"output {name}", marks=False)
    _curve(axes[1], steps, history.column("grad_global_norm").tolist(), "grad global norm")
    kept = report.records
    for index, name in worst_layers(report):
        _curve(axes[2], [r.step for r in kept], [_layer_max(r, index) for r in kept], name, marks=False)
    axes[2].set_ylabel("layer max |x|")
    if len(axes[2].get_lines()):
        axes[2].legend(fontsize="small", loc="upper left")
    for axis in axes:
        _mark_onsets(axis, report)
    axes[0].legend(fontsize="small", loc="upper left")
    axes[2].set_xlabel("step")
    status = report.status.upper()
    spec = Path(str(report.run.get("spec"))).name
    figure.suptitle(f"nanscope trace-steps: {spec} ({status}, {report.steps_run} steps)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_loss_curves(curves: Mapping[str, Sequence[float]], path: str | os.PathLike[str], title: str | None = None,
                     onsets: Mapping[str, int | None] | None = None) -> None:
    """Write one loss curve per name to an image file (compare-clipping's strategies).

    Args:
        curves: dict of name -> list of float. Loss per step; NaN/Inf are marked, not drawn.
        path: str or Path. The image file.
        title: str, optional. The figure title.
        onsets: dict of name -> int, optional. Each curve's first non-finite step, drawn dotted.
    """
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for name, losses in curves.items():
        line = _curve(axis, list(range(len(losses))), losses, name)
        step = (onsets or {}).get(name)
        if step is not None and line is not None:
            axis.axvline(step, color=line.get_color(), linestyle=":", linewidth=1)
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.legend(fontsize="small")
    if title:
        axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def worst_layers(report: TraceReport, count: int = WORST_LAYERS) -> list[tuple[int, str]]:
    """(index, name) of the layers with the largest finite max |x| over the run, non-finite ones first."""
    rows = report.layer_summaries()
    ranked = sorted(range(len(rows)), key=lambda i: (-rows[i]["nonfinite_steps"], -(rows[i]["max_abs"] or 0.0)))
    return [(i, rows[i]["name"]) for i in ranked[:count]]


def _layer_max(record: StepRecord, index: int) -> float:
    stats = record.layers[index] if index < len(record.layers) else None
    if stats is None or not stats.called:
        return math.nan
    return math.inf if stats.nonfinite else stats.max_abs


def _curve(axis: Axes, steps: Sequence[int], values: Sequence[float | None], label: str,
           marks: bool = True) -> Line2D | None:
    """Draw the finite values (log scale when all are positive); x's at the top for non-finite ones."""
    finite = [(s, v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    line = None
    if finite:
        (line,) = axis.plot([s for s, _ in finite], [v for _, v in finite], label=label, linewidth=1.2)
        if all(v > 0 for _, v in finite):
            axis.set_yscale("log")
    bad = [s for s, v in zip(steps, values) if v is None or not math.isfinite(v)]
    if bad and marks:
        axis.plot(bad, [1.0] * len(bad), "x", color="red", transform=axis.get_xaxis_transform(),
                  clip_on=False, label=f"{label}: non-finite")
    if marks:
        axis.set_ylabel(label)
    return line


def _mark_onsets(axis: Axes, report: TraceReport) -> None:
    first = report.first_nonfinite
    if first is not None:
        axis.axvline(first.step, color="red", linewidth=1, label=f"first non-finite: step {first.step} ({first.phase})")
    for rec in report.recommendations:
        onset = (rec.data or {}).get("onset_step") if isinstance(rec.data, dict) else None
        if onset is not None:
            axis.axvline(onset, color="orange", linestyle="--", linewidth=1, label=f"{rec.id} onset: step {onset}")
            break
