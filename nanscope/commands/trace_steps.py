"""`nanscope trace-steps`: run instrumented steps, then report where the first NaN/Inf appeared and why."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from nanscope.commands.output import deliver, outcome
from nanscope.commands.outpaths import check_output_paths
from nanscope.model.specpaths import check_spec_paths
from nanscope.spec.options import TraceOptions

if TYPE_CHECKING:  # imported where they run: `--help` and bad input do not load them
    from nanscope.engine.cluster import Cluster
    from nanscope.guard.options import GuardOptions
    from nanscope.report.model import TraceReport
    from nanscope.spec.sections import RunSpec


def run(spec: str | os.PathLike[str], options: TraceOptions) -> int:
    """Run trace-steps on the spec file `spec` with the command's options; return the exit code."""
    keep_going, guard = guard_choices(options.on_nonfinite, options.mode, options.keep_going)
    options = replace(options, keep_going=keep_going, guard=guard)
    json_out, trace, plot, strict = options.json_out, options.trace_path, options.plot, options.strict
    from nanscope.render.trace_report import render_trace_report
    from nanscope.spec.load import apply_overrides, load_spec
    from nanscope.run.trace import run_trace, stopped_before_training

    if plot is not None:
        from nanscope.report.plotting import require_matplotlib

        require_matplotlib()

    def check() -> None:
        check_output_paths(files=[("--json", json_out), ("--trace", trace)], images=[("--plot", plot)],
                           folders=[("--save-repro", options.save_repro), ("--tensorboard", options.tensorboard)])

    loaded: list[RunSpec] = []

    def work() -> TraceReport:
        run_spec = apply_overrides(load_spec(spec), **options.overrides)
        loaded.append(run_spec)
        check_spec_paths(run_spec)  # before TensorFlow loads: a missing file is reported at once
        return run_trace(run_spec, options)

    report = outcome(check, work, lambda: stopped_before_training(spec))
    if report.cluster is not None and not report.cluster.is_chief:
        return _worker_exit(report, report.cluster, strict)
    if report.cluster is None and loaded and _other_worker(loaded[0]):  # stopped by a signal while joining
        print("nanscope: interrupted during start-up; only the chief (worker task 0) writes a report",
              file=sys.stderr)
        return report.exit_code(strict=strict)
    code = deliver(lambda console: render_trace_report(report, console, options.show_all), report.to_json, json_out,
                   report.exit_code(strict=strict))
    if report.stopped:
        print(f"nanscope: error: {report.stopped}; the report covers the steps before it", file=sys.stderr)
    if report.cluster is not None:
        from nanscope.engine.cluster import publish_exit_code

        publish_exit_code(code)
    return code


def guard_choices(on_nonfinite: str | None, mode: str, keep_going: bool) -> tuple[bool, GuardOptions | None]:
    """(keep_going, GuardOptions or None) from `--keep-going`, `--on-nonfinite` and `--mode`; what trace-steps
    cannot do is bad input (exit 2), before training. The choices are the library's (`nanscope.guard.options`)."""
    from nanscope.errors import NanscopeError
    from nanscope.guard.options import MODES, ON_NONFINITE, GuardOptions

    if on_nonfinite not in (None, *ON_NONFINITE):
        raise NanscopeError(f"--on-nonfinite: must be {', '.join(ON_NONFINITE)}, not {on_nonfinite!r}")
    if mode not in MODES:
        raise NanscopeError(f"--mode: must be {' or '.join(MODES)}, not {mode!r}")
    if on_nonfinite in ("stop", "skip", "rollback") and keep_going:
        raise NanscopeError(f"--on-nonfinite {on_nonfinite} contradicts --keep-going: give one")
    if on_nonfinite in ("skip", "rollback"):
        return True, GuardOptions(on_nonfinite=on_nonfinite, mode=mode)
    keep_going = keep_going or on_nonfinite == "continue"
    if mode == "sentinel":
        return keep_going, GuardOptions(on_nonfinite="continue" if keep_going else "stop", mode=mode)
    return keep_going, None


def _other_worker(run_spec: RunSpec) -> bool:
    """True for a multi-worker run's worker other than the chief, by its TF_CONFIG (which was read once already)."""
    if run_spec.train.distribute != "multi_worker":
        return False
    from nanscope.engine.cluster import read_tf_config
    from nanscope.errors import NanscopeError

    try:
        return not read_tf_config(run_spec.source, run_spec.train.distribute_timeout_s).is_chief
    except NanscopeError:
        return False


def _worker_exit(report: TraceReport, cluster: Cluster, strict: bool) -> int:
    """A worker other than the chief: one line naming its role; the chief's exit code (its own if the chief is gone)."""
    from nanscope.engine.cluster import chief_exit_code

    if report.stopped:
        print(f"nanscope: error: {report.stopped}", file=sys.stderr)
        return report.exit_code(strict=strict)
    code = chief_exit_code(cluster)
    if code is None:
        code = report.exit_code(strict=strict)
        print(f"nanscope: {cluster.role}: the chief did not report its exit code; exit {code} from this worker's "
              "records", file=sys.stderr)
    else:
        print(f"nanscope: {cluster.role}: the chief (task 0) writes the report; exit {code} (the chief's)",
              file=sys.stderr)
    return code
