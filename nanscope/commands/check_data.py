"""`nanscope check-data`: scan training data for NaN/Inf, bad scales and labels that do not fit the loss."""

from nanscope.commands.output import deliver
from nanscope.outpaths import check_output_paths


def run(source, *, json_out=None, target=None, loss=None, classes=None, sample=None, show_all=False):
    """Scan `source` (a run spec or a data file); return the exit code."""
    from nanscope.checkdata import scan_data
    from nanscope.render.data_report import render_data_report, scan_progress

    check_output_paths(files=[("--json", json_out)])
    with scan_progress() as on_progress:
        scan = scan_data(source, target=target, loss=loss, classes=classes, sample=sample, on_progress=on_progress)
    return deliver(lambda console: render_data_report(scan, console, show_all), scan.to_json, json_out,
                   scan.exit_code())
