"""The `nanscope` command line: registers commands, nothing else.

Each command parses its options, calls one library function and hands the result
to a renderer. `run_command` is the one place where errors become exit codes.
Nothing here imports TensorFlow at module level, so `--help` stays fast.
"""

import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from nanscope.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NanscopeError

app = typer.Typer(
    help=(
        "Find out why a TensorFlow/Keras training run produces NaN or Inf, and which fix makes it stop.\n\n"
        "A model `factory:` in a run spec is Python code that nanscope imports and runs: "
        "only point nanscope at code you trust."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SpecArg = Annotated[Path, typer.Argument(help="YAML run spec (model, data, train sections).", show_default=False)]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="Override train.steps.", show_default=False)]
LrOpt = Annotated[Optional[float], typer.Option("--lr", help="Override the optimizer's learning_rate.", show_default=False)]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-size", help="Override data.batch_size.", show_default=False)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Override train.seed.", show_default=False)]
JsonOpt = Annotated[
    Optional[str], typer.Option("--json", help="Write the JSON report to PATH ('-' for stdout).", show_default=False)
]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 on warning-level findings too.")]


def run_command(body):
    """Run a command body; map its outcome to an exit code and its errors to one line on stderr.

    SIGTERM is turned into KeyboardInterrupt, so a terminated run finishes its report
    like an interrupted one and exits 130.
    """
    debug = os.environ.get("NANSCOPE_DEBUG") == "1"
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = body()
    except NanscopeError as exc:
        if debug:
            traceback.print_exc()
        typer.echo(f"nanscope: error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("nanscope: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(code or 0)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _console(json_target):
    """The console for the human report: stderr when the JSON goes to stdout."""
    from rich.console import Console

    return Console(stderr=json_target == "-", soft_wrap=False)


@app.command("trace-steps")
def trace_steps(
    spec: SpecArg,
    steps: StepsOpt = None,
    lr: LrOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = None,
    json_out: JsonOpt = None,
    trace: Annotated[
        Optional[Path], typer.Option("--trace", help="JSON-lines trace file (default: nanscope-runs/<spec>/trace.jsonl).")
    ] = None,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Continue past the first non-finite step.")] = False,
    strict: StrictOpt = False,
):
    """Run instrumented train steps and report where the first NaN/Inf appears and why."""

    def body():
        from nanscope.render.trace_report import render_trace_report
        from nanscope.spec import apply_overrides, load_spec
        from nanscope.trace import TraceOptions, run_trace

        run_spec = apply_overrides(load_spec(spec), steps=steps, learning_rate=lr, batch_size=batch_size, seed=seed)
        options = TraceOptions(trace_path=trace, keep_going=keep_going)
        report = run_trace(run_spec, options)
        render_trace_report(report, _console(json_out))
        if json_out:
            from nanscope.jsonio import write_json

            write_json(json_out, report.to_json())
        return report.exit_code(strict=strict)

    run_command(body)


@app.command("check-data")
def check_data(
    source: Annotated[Path, typer.Argument(help="A run spec (its data section) or a data file (.npz, .npy, .csv, .tfrecord).")],
    json_out: JsonOpt = None,
    target: Annotated[
        Optional[str], typer.Option("--target", help="Target column (csv) or feature (TFRecord) of a data file.")
    ] = None,
    loss: Annotated[
        Optional[str], typer.Option("--loss", help="Loss to check the labels against (default: the spec's).")
    ] = None,
    classes: Annotated[Optional[int], typer.Option("--classes", help="Number of classes the labels should span.")] = None,
    sample: Annotated[
        Optional[int], typer.Option("--sample", min=1, help="Scan a uniform sample of N rows instead of all.")
    ] = None,
):
    """Scan the training data for NaN/Inf, bad scales and labels that do not fit the loss."""

    def body():
        from nanscope.checkdata import scan_data
        from nanscope.render.data_report import render_data_report, scan_progress

        with scan_progress() as on_progress:
            scan = scan_data(source, target=target, loss=loss, classes=classes, sample=sample, on_progress=on_progress)
        render_data_report(scan, _console(json_out))
        if json_out:
            from nanscope.jsonio import write_json

            write_json(json_out, scan.to_json())
        return scan.exit_code()

    run_command(body)


@app.command("compare-clipping")
def compare_clipping(spec: SpecArg, json_out: JsonOpt = None):
    """Train the same model from the same weights under each clipping strategy and pick one."""

    def body():
        raise NanscopeError("compare-clipping is not yet available")

    run_command(body)


@app.command("report")
def report(
    trace: Annotated[Path, typer.Argument(help="A JSON-lines trace written by trace-steps.")],
    json_out: JsonOpt = None,
    strict: StrictOpt = False,
):
    """Redraw a trace-steps report from its trace file, without rerunning training."""

    def body():
        from nanscope.render.trace_report import render_trace_report
        from nanscope.report import from_trace
        from nanscope.tracefile import read_trace

        rebuilt = from_trace(*read_trace(trace), trace_path=trace)
        render_trace_report(rebuilt, _console(json_out))
        if json_out:
            from nanscope.jsonio import write_json

            write_json(json_out, rebuilt.to_json())
        return rebuilt.exit_code(strict=strict)

    run_command(body)


def main():
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())
