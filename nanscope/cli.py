"""The `nanscope` command line: registers commands, nothing else.

Each command parses its options and calls `run` of its module in `nanscope.commands`,
which holds the orchestration. `run_command` is the one place where errors become
exit codes.
Nothing here imports TensorFlow at module level, so `--help` stays fast.
"""

import contextlib
import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NoReturn

import typer

from nanscope import interrupt
from nanscope.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NanscopeError
from nanscope.internals import usage_error
from nanscope.spec.options import (
    CheckDataOptions,
    CompareClippingOptions,
    ReplayOptions,
    ReportOptions,
    TraceOptions,
)


def _as_flag(option: Any) -> Any:
    """Show `--help` as the flag it is, without a `<bool>` type (Typer's own help option has no metavar)."""
    if option is not None:
        option.metavar = ""
    return option


# The click Context and Option a Typer command's hooks take are the click Typer vendors (typer._click): Any here.
class Command(typer.core.TyperCommand):
    """A nanscope command (its `--help` shown as a flag)."""

    def get_help_option(self, ctx: Any) -> Any:
        return _as_flag(super().get_help_option(ctx))


class Group(typer.core.TyperGroup):
    """The nanscope command group (its `--help` shown as a flag)."""

    def get_help_option(self, ctx: Any) -> Any:
        return _as_flag(super().get_help_option(ctx))


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


def flag(name: str, text: str) -> Any:
    """A boolean option that takes no value: its help shows no `<bool>` type, as if it wanted one."""
    return typer.Option(name, help=text, metavar="")


def cli_option(declared: dataclasses.Field[Any]) -> Any:
    """The Typer option of an options dataclass field declared with `nanscope.spec.options.option`."""
    meta = declared.metadata
    if declared.type is bool:
        return flag(meta["flag"], meta["help"])
    extra = {"min": meta["min"]} if meta["min"] is not None else {}
    return typer.Option(meta["flag"], help=meta["help"], show_default=meta["show_default"], **extra)


def register(name: str, options: type[Any], argument: str, argument_help: Any, call: Callable[[Path, Any], int]
             ) -> Callable[..., Any]:
    """Register the command `name`: its one argument, then an option per field of the dataclass `options` that
    declares one, in field order. The command runs `call(argument, options(**given))` (`run_command`).

    The options are declared once, in `nanscope.spec.options`; this builds the Typer parameters from them.
    """
    import inspect

    def command(**given: Any) -> None:
        value = given.pop(argument)
        run_command(lambda: call(value, options(**given)))

    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter(argument, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=argument_help)]
    parameters += [inspect.Parameter(declared.name, keyword, default=declared.default,
                                     annotation=Annotated[declared.type, cli_option(declared)])
                   for declared in dataclasses.fields(options) if "flag" in declared.metadata]
    built: Any = command  # inspect and Typer read `__signature__`, which typeshed does not declare on a function
    built.__signature__ = inspect.Signature(parameters, return_annotation=None)
    built.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    built.__name__ = name.replace("-", "_")
    built.__doc__ = call.__doc__
    return app.command(name, cls=Command)(built)


def run_command(body: Callable[[], int | None]) -> None:
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
def _debug_log(enabled: bool) -> Iterator[None]:
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


def one_line(exc: object) -> str:
    """The error's message as one line: newlines (user code, Keras, TensorFlow) collapse to spaces."""
    return " ".join(str(exc).split())


def _trace_steps(spec: Path, options: TraceOptions) -> int:
    """Run instrumented train steps and report where the first NaN/Inf appears and why."""
    from nanscope.commands import trace_steps

    return trace_steps.run(spec, options)


def _replay(directory: Path, options: ReplayOptions) -> int:
    """Re-run one saved step eagerly and show the op, layer and line that produced the first NaN/Inf."""
    from nanscope.commands import replay

    return replay.run(directory, options)


def _check_data(source: Path, options: CheckDataOptions) -> int:
    """Scan the training data for NaN/Inf, bad scales and labels that do not fit the loss."""
    from nanscope.commands import check_data

    return check_data.run(source, options)


def _compare_clipping(spec: Path, options: CompareClippingOptions) -> int:
    """Train the same model from the same weights under each clipping strategy and pick one."""
    from nanscope.commands import compare_clipping

    return compare_clipping.run(spec, options)


def _report(trace: Path, options: ReportOptions) -> int:
    """Redraw a trace-steps report from its trace file, without rerunning training."""
    from nanscope.commands import report

    return report.run(trace, options)


register("trace-steps", TraceOptions, "spec", SpecArg, _trace_steps)
register("replay", ReplayOptions, "directory", Annotated[Path, typer.Argument(
    help="A folder written by `trace-steps --save-repro DIR` or by `NanScope(repro=DIR)` in fit.")], _replay)
register("check-data", CheckDataOptions, "source", Annotated[Path, typer.Argument(
    help="A run spec (its data section) or a data file (.npz, .npy, .csv, .tfrecord).")], _check_data)
register("compare-clipping", CompareClippingOptions, "spec", SpecArg, _compare_clipping)
register("report", ReportOptions, "trace", Annotated[Path, typer.Argument(
    help="A JSON-lines trace written by trace-steps.")], _report)


def main() -> NoReturn:
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


def exit_now(code: int) -> NoReturn:
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
