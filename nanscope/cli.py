"""The `nanscope` command line: registers commands, nothing else.

Each command parses its options and calls `run` of its module in `nanscope.commands`,
which holds the orchestration. `run_command` is the one place where errors become
exit codes.
Nothing here imports TensorFlow at module level, so `--help` stays fast.
"""

import contextlib
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from nanscope import interrupt
from nanscope.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NanscopeError
from nanscope.internals import usage_error


class _HelpFlag:
    """Show `--help` as the flag it is, without a `<bool>` type (Typer's own help option has no metavar)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class Command(_HelpFlag, typer.core.TyperCommand):
    """A nanscope command (see _HelpFlag)."""


class Group(_HelpFlag, typer.core.TyperGroup):
    """The nanscope command group (see _HelpFlag)."""


app = typer.Typer(
    cls=Group,
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
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Override train.steps.", show_default=False)]
LrOpt = Annotated[float | None,
                  typer.Option("--lr", help="Override the optimizer's learning_rate.", show_default=False)]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", help="Override data.batch_size.", show_default=False)]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Override train.seed.", show_default=False)]
JsonOpt = Annotated[
    str | None, typer.Option("--json", help="Write the JSON report to PATH ('-' for stdout).", show_default=False)
]


def flag(name, text):
    """A boolean option that takes no value: its help shows no `<bool>` type, as if it wanted one."""
    return typer.Option(name, help=text, metavar="")


StrictOpt = Annotated[bool, flag("--strict", "Exit 1 on warning-level findings too.")]
AllOpt = Annotated[bool, flag("--all", "Show every row of the layer and variable tables (default: the largest "
                                       "and those the findings name).")]


def run_command(body):
    """Run a command body; map its outcome to an exit code and its errors to one line on stderr.

    SIGINT and SIGTERM stop training between steps (`nanscope.interrupt`); the run
    finishes its report for the steps done and exits 130.
    """
    debug = os.environ.get("NANSCOPE_DEBUG") == "1"
    interrupt.install()
    try:
        with _debug_log(debug):
            code = body()
    except NanscopeError as exc:
        if debug:
            traceback.print_exc()
        typer.echo(f"nanscope: error: {one_line(exc)}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:  # a path the user gave that cannot be written or read: --json, --trace, --plot, ...
        if debug:
            traceback.print_exc()
        where = exc.filename2 or exc.filename
        what = exc.strerror or str(exc)
        typer.echo(f"nanscope: error: {one_line(f'{where}: {what}' if where else what)}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("nanscope: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if code == EXIT_INTERRUPTED or interrupt.requested():
        typer.echo("nanscope: interrupted; the report covers the work done before the signal", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(code or 0)


@contextlib.contextmanager
def _debug_log(enabled):
    """With NANSCOPE_DEBUG=1, the `nanscope` logger's records (the traceback of a part left out of a report,
    nanscope.finishing) go to stderr for the command's duration."""
    if not enabled:
        yield
        return
    logger, handler = logging.getLogger("nanscope"), logging.StreamHandler(sys.stderr)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def one_line(exc):
    """The error's message as one line: newlines (user code, Keras, TensorFlow) collapse to spaces."""
    return " ".join(str(exc).split())


@app.command("trace-steps", cls=Command)
def trace_steps(
    spec: SpecArg,
    steps: StepsOpt = None,
    lr: LrOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = None,
    json_out: JsonOpt = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="JSON-lines trace file (default: nanscope-runs/<spec>/trace.jsonl).")
    ] = None,
    keep_going: Annotated[bool, flag("--keep-going", "Continue past the first non-finite step.")] = False,
    on_nonfinite: Annotated[
        str | None, typer.Option("--on-nonfinite", help="stop (default), continue (= --keep-going), skip (undo the "
                                                        "step, go on) or rollback (an earlier state, a lower "
                                                        "learning rate); docs/guard.md.")
    ] = None,
    mode: Annotated[
        str, typer.Option("--mode", help="full (default) or sentinel: the scalars on most steps, the full statistics "
                                       "on every 100th and around events (docs/guard.md).")
    ] = "full",
    strict: StrictOpt = False,
    show_all: AllOpt = False,
    save_repro: Annotated[
        Path | None, typer.Option("--save-repro",
                                  help="Save the first non-finite step to DIR for `nanscope replay DIR`.")
    ] = None,
    verify: Annotated[
        bool, flag("--verify", "Re-run with each fix nanscope can apply and mark it verified.")
    ] = False,
    tensorboard: Annotated[
        Path | None, typer.Option("--tensorboard", help="Write per-step scalars to this TensorBoard log DIR.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Draw loss, grad norm and the worst layers to FILE (.png, .svg or .pdf; "
                                    "needs nanscope\\[plot])."),
    ] = None,
    unsafe: Annotated[
        bool,
        flag("--unsafe", "Load a .keras file without Keras safe mode (Lambda layers run stored Python "
                         "code): only for files you trust."),
    ] = False,
    keep_steps: Annotated[
        int, typer.Option("--keep-steps", min=1, help="Keep every layer's and variable's row for the first N steps, "
                                                      "the last N and N around the first NaN (default 500).")
    ] = 500,
    sample_steps: Annotated[
        int, typer.Option("--sample-steps", min=2, help="...and for an even sample of N steps in between "
                                                        "(default 500).")
    ] = 500,
    trace_full: Annotated[
        bool, flag("--trace-full", "Write every step's full row to the trace (by default: every step's scalars, "
                                   "full rows of the kept steps).")
    ] = False,
) -> None:
    """Run instrumented train steps and report where the first NaN/Inf appears and why."""
    from nanscope.commands import trace_steps as command

    run_command(lambda: command.run(spec, steps=steps, lr=lr, batch_size=batch_size, seed=seed, json_out=json_out,
                                    trace=trace, keep_going=keep_going, on_nonfinite=on_nonfinite, mode=mode,
                                    strict=strict, show_all=show_all,
                                    save_repro=save_repro, verify=verify, tensorboard=tensorboard, plot=plot,
                                    unsafe=unsafe, keep_steps=keep_steps, sample_steps=sample_steps,
                                    trace_full=trace_full))


@app.command("replay", cls=Command)
def replay(
    directory: Annotated[Path, typer.Argument(
        help="A folder written by `trace-steps --save-repro DIR` or by `NanScope(repro=DIR)` in fit.")],
    json_out: JsonOpt = None,
    verify: Annotated[
        bool, flag("--verify", "Apply each fix nanscope can apply to the saved step and say whether it stays finite.")
    ] = False,
    unsafe: Annotated[
        bool, flag("--unsafe", "Load a bundle's model without Keras safe mode (Lambda layers run stored Python "
                               "code): only for bundles you trust."),
    ] = False,
) -> None:
    """Re-run one saved step eagerly and show the op, layer and line that produced the first NaN/Inf."""
    from nanscope.commands import replay as command

    run_command(lambda: command.run(directory, json_out=json_out, verify=verify, unsafe=unsafe))


@app.command("check-data", cls=Command)
def check_data(
    source: Annotated[
        Path, typer.Argument(help="A run spec (its data section) or a data file (.npz, .npy, .csv, .tfrecord).")
    ],
    json_out: JsonOpt = None,
    target: Annotated[
        str | None, typer.Option("--target", help="Target column (csv) or feature (TFRecord) of a data file.")
    ] = None,
    loss: Annotated[
        str | None, typer.Option("--loss", help="Loss to check the labels against (default: the spec's).")
    ] = None,
    classes: Annotated[
        int | None, typer.Option("--classes", help="Number of classes the labels should span.")
    ] = None,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Scan a uniform sample of N rows instead of all.")
    ] = None,
    show_all: Annotated[bool, flag("--all", "Show every column (default: the flagged ones first, up to 40).")] = False,
) -> None:
    """Scan the training data for NaN/Inf, bad scales and labels that do not fit the loss."""
    from nanscope.commands import check_data as command

    run_command(lambda: command.run(source, json_out=json_out, target=target, loss=loss, classes=classes,
                                    sample=sample, show_all=show_all))


@app.command("compare-clipping", cls=Command)
def compare_clipping(
    spec: SpecArg,
    steps: StepsOpt = None,
    strategies: Annotated[
        str | None,
        typer.Option(
            "--strategies",
            help="Comma-separated: none, clipvalue[=V], clipnorm[=C], global_clipnorm[=C], manual_clip_by_norm[=C], "
                 "manual_clip_by_global_norm[=C], auto. Without a threshold it is derived from the unclipped run. "
                 "Default: none,clipvalue,clipnorm,global_clipnorm,auto.",
            show_default=False,
        ),
    ] = None,
    lr: LrOpt = None,
    batch_size: BatchOpt = None,
    seed: SeedOpt = None,
    json_out: JsonOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Write the loss curves to FILE (.png, .svg or .pdf; needs nanscope\\[plot])."),
    ] = None,
) -> None:
    """Train the same model from the same weights under each clipping strategy and pick one."""
    from nanscope.commands import compare_clipping as command

    run_command(lambda: command.run(spec, steps=steps, strategies=strategies, lr=lr, batch_size=batch_size,
                                    seed=seed, json_out=json_out, plot=plot))


@app.command("report", cls=Command)
def report(
    trace: Annotated[Path, typer.Argument(help="A JSON-lines trace written by trace-steps.")],
    json_out: JsonOpt = None,
    strict: StrictOpt = False,
    show_all: AllOpt = False,
) -> None:
    """Redraw a trace-steps report from its trace file, without rerunning training."""
    from nanscope.commands import report as command

    run_command(lambda: command.run(trace, json_out=json_out, strict=strict, show_all=show_all))


def main():
    """Console-script entry point: a usage error (a bad option value) is one line and exit 2 too."""
    try:
        code = app(standalone_mode=False)
    except usage_error() as exc:
        message = exc.format_message().strip()
        if message:  # a bare `nanscope` has printed the help already and says nothing more
            where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
            typer.echo(f"nanscope: error: {where}{message}".replace("\n", " "), err=True)
        code = EXIT_BAD_INPUT
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("nanscope: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except typer.Exit as exc:
        code = exc.exit_code
    exit_now(code if isinstance(code, int) else 0)


def exit_now(code):
    """End the process with `code`; once TensorFlow is loaded, without the interpreter's teardown.

    Everything a command writes (the JSON, the trace, the TensorBoard log, the plot) is
    closed before it returns. What is left at exit is freeing TensorFlow's objects one by
    one, which takes 1-5 s on 2 busy cores, however long the run was: the report is out,
    and the user would wait for nothing.
    """
    if "tensorflow" not in sys.modules:
        raise SystemExit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
