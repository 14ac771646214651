"""`nanscope replay`: re-run one saved step eagerly and name the op, layer and line behind the first NaN/Inf."""

import os

from nanscope.commands.output import deliver
from nanscope.commands.outpaths import check_output_paths
from nanscope.spec.options import ReplayOptions


def run(directory: str | os.PathLike[str], options: ReplayOptions) -> int:
    """Replay the repro folder `directory` (and try the fixes on it with `options.verify`; `options.unsafe`: load a
    model that needs Keras' unsafe deserialization); return the exit code."""
    from nanscope.replay import replay_document, replay_repro
    from nanscope.render.trace_report import render_replay

    check_output_paths(files=[("--json", options.json_out)])
    report = replay_repro(directory, verify=options.verify, unsafe=options.unsafe)
    return deliver(lambda console: render_replay(report, console), lambda: replay_document(report), options.json_out,
                   report.exit_code())
