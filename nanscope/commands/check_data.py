"""`nanscope check-data`: scan training data for NaN/Inf, bad scales and labels that do not fit the loss."""

import os

from nanscope.commands.output import deliver
from nanscope.commands.outpaths import check_output_paths
from nanscope.spec.options import CheckDataOptions


def run(source: str | os.PathLike[str], options: CheckDataOptions) -> int:
    """Scan `source` (a run spec or a data file); return the exit code."""
    from nanscope.checkdata import scan_data
    from nanscope.render.data_report import render_data_report, scan_progress

    check_output_paths(files=[("--json", options.json_out)])
    with scan_progress() as on_progress:
        scan = scan_data(source, target=options.target, loss=options.loss, classes=options.classes,
                         sample=options.sample, on_progress=on_progress)
    return deliver(lambda console: render_data_report(scan, console, options.show_all), scan.to_json, options.json_out,
                   scan.exit_code())
