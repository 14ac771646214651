"""`nanscope check-data`: scan training data for NaN/Inf, bad scales and labels that do not fit the loss."""

import os

from nanscope.commands.output import deliver
from nanscope.commands.outpaths import check_output_paths


def run(source: str | os.PathLike[str], *, json_out: str | None = None, target: str | None = None,
        loss: str | None = None, classes: int | None = None, sample: int | None = None, show_all: bool = False) -> int:
    """Scan `source` (a run spec or a data file); return the exit code."""
    from nanscope.checkdata import scan_data
    from nanscope.render.data_report import render_data_report, scan_progress

    check_output_paths(files=[("--json", json_out)])
    with scan_progress() as on_progress:
        scan = scan_data(source, target=target, loss=loss, classes=classes, sample=sample, on_progress=on_progress)
    return deliver(lambda console: render_data_report(scan, console, show_all), scan.to_json, json_out,
                   scan.exit_code())
