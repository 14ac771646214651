"""`nanscope compare-clipping`: train the same start under each clipping strategy and pick one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from nanscope.commands.output import deliver, outcome
from nanscope.commands.outpaths import check_output_paths
from nanscope.model.specpaths import check_spec_paths
from nanscope.spec.options import CompareClippingOptions

if TYPE_CHECKING:
    from nanscope.run.clipping.result import ClippingReport


def run(spec: str | os.PathLike[str], options: CompareClippingOptions) -> int:
    """Compare the clipping strategies `options` names on the spec file `spec`; return the exit code."""
    from nanscope.run.clipping import compare_clipping, parse_strategies
    from nanscope.run.clipping.compare import stopped_before_training
    from nanscope.report.plotting import require_matplotlib
    from nanscope.render.clipping_report import clipping_progress, render_clipping_report
    from nanscope.spec.load import apply_overrides, load_spec

    chosen = parse_strategies(options.strategies)
    json_out, plot = options.json_out, options.plot
    if plot is not None:
        require_matplotlib()

    def check() -> None:
        check_output_paths(files=[("--json", json_out)], images=[("--plot", plot)])

    def work() -> ClippingReport:
        run_spec = apply_overrides(load_spec(spec), **options.overrides)
        check_spec_paths(run_spec)  # before TensorFlow loads: a missing file is reported at once
        with clipping_progress() as on_progress:
            return compare_clipping(run_spec, chosen, on_progress=on_progress)

    report = outcome(check, work, lambda: stopped_before_training(spec, chosen))
    writes = [(f"the plot {plot}", lambda: plot_strategies(report, plot))] if plot is not None else []
    return deliver(lambda console: render_clipping_report(report, console), report.to_json, json_out,
                   report.exit_code(), writes=writes)


def plot_strategies(report: ClippingReport, path: str | os.PathLike[str]) -> None:
    """Write every strategy's training loss curve to the image `path`, each first non-finite step dotted."""
    from nanscope.report.plotting import plot_loss_curves

    curves = {run.strategy.name: run.result.losses for run in report.runs}
    onsets = {run.strategy.name: run.result.first_nonfinite_step for run in report.runs}
    plot_loss_curves(curves, path, title=f"compare-clipping: {report.run.get('spec')}", onsets=onsets)
