"""`nanscope report`: redraw a trace-steps report from its trace file, without rerunning training."""

import os

from nanscope.commands.output import deliver
from nanscope.commands.outpaths import check_output_paths
from nanscope.spec.options import ReportOptions


def run(trace: str | os.PathLike[str], options: ReportOptions) -> int:
    """Rebuild the report of the trace file `trace`; return the exit code."""
    from nanscope.render.trace_report import render_trace_report
    from nanscope.report.redraw import load_trace

    check_output_paths(files=[("--json", options.json_out)])
    rebuilt = load_trace(trace)
    return deliver(lambda console: render_trace_report(rebuilt, console, options.show_all), rebuilt.to_json,
                   options.json_out, rebuilt.exit_code(strict=options.strict))
