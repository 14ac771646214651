"""Each command's options, declared once: the CLI derives its flags from these fields, the command and the library
take the dataclass.

A field declared with `option(...)` is a command-line option: its default, its flag and its help are here and
nowhere else (`nanscope.cli.register` builds the Typer parameters from them). A field declared with plain
`field(...)` is for library callers only (a progress callback, the guard's settings the command derives).
This module imports nothing heavy, so `nanscope --help` reads it without TensorFlow or pydantic.

Example:
    options = TraceOptions(steps=300, verify=True)
    report = run_trace(apply_overrides(spec, **options.overrides), options)
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Full rows (every layer and variable) a run keeps of its first steps, of its last steps and around each
# event, and of an even sample in between (`nanscope.store.history.StepHistory`).
DEFAULT_KEEP = 500
DEFAULT_SAMPLE = 500


def option(default: Any, flag: str, help: str, *, minimum: int | None = None, show_default: bool = True) -> Any:
    """A dataclass field that is also a command-line option `flag` (a bool is a flag that takes no value).

    Args:
        default: the field's default, and the option's.
        flag: str. The option's name on the command line ("--keep-steps").
        help: str. The option's help line.
        minimum: int, optional. The smallest value the command line accepts (an int option).
        show_default: bool, default True. Whether `--help` shows the default.
    """
    return field(default=default, metadata={"flag": flag, "help": help, "min": minimum,
                                            "show_default": show_default})


# Options several commands take, spelled once.
JSON_HELP = "Write the JSON report to PATH ('-' for stdout)."
STRICT_HELP = "Exit 1 on warning-level findings too."
TABLES_HELP = "Show every row of the layer and variable tables (default: the largest and those the findings name)."


@dataclass(frozen=True)
class SpecOverrides:
    """The options that override a run spec's fields for one run (`nanscope.spec.load.apply_overrides`).

    Args:
        steps: int, optional. train.steps.
        lr: float, optional. The optimizer's learning_rate.
        batch_size: int, optional. data.batch_size.
        seed: int, optional. train.seed.
    """

    steps: int | None = option(None, "--steps", "Override train.steps.", show_default=False)
    lr: float | None = option(None, "--lr", "Override the optimizer's learning_rate.", show_default=False)
    batch_size: int | None = option(None, "--batch-size", "Override data.batch_size.", show_default=False)
    seed: int | None = option(None, "--seed", "Override train.seed.", show_default=False)

    @property
    def overrides(self) -> dict[str, Any]:
        """The keyword arguments of `apply_overrides`."""
        return {"steps": self.steps, "learning_rate": self.lr, "batch_size": self.batch_size, "seed": self.seed}


@dataclass(frozen=True)
class TraceOptions(SpecOverrides):
    """How to run trace-steps (`nanscope trace-steps`, `nanscope.run.trace.run_trace`).

    Args:
        steps, lr, batch_size, seed: the spec's fields overridden (`SpecOverrides`).
        json_out: str, optional. Where the command writes the JSON report ("-": stdout).
        trace_path: Path, optional. The JSON-lines trace (default: nanscope-runs/<spec name>/trace.jsonl).
        keep_going: bool, default False. Continue past the first non-finite step to the step limit.
        on_nonfinite: str, optional. stop (default), continue, skip or rollback (docs/guard.md).
        mode: str, default "full". full, or sentinel: the scalars on most steps, the full statistics on
            every 100th and around events.
        strict: bool, default False. The command exits 1 on warning-level findings too.
        show_all: bool, default False. The printed report shows every row of its tables.
        save_repro: Path, optional. Write what a replay of the first non-finite step needs to this folder.
        verify: bool, default False. Re-run training with each applicable fix and mark recommendations verified.
        tensorboard: Path, optional. Write every step's scalars to this TensorBoard log folder as it is made.
        plot: Path, optional. Draw loss, gradient norm and the worst layers over steps to this image (matplotlib).
        unsafe: bool, default False. Allow `.keras` files that need unsafe deserialization.
        keep_steps: int, default DEFAULT_KEEP. Full rows (every layer and variable) kept of the first steps,
            of the last steps and of the steps around an event.
        sample_steps: int, default DEFAULT_SAMPLE. Full rows kept of an even sample of the steps in between.
        trace_full: bool, default False. Write every step's full row to the trace, not only the kept ones.
        on_step: callable(StepRecord), optional (library only). Called after each step (progress display).
        forensics: bool, default True (library only). Replay the first non-finite step eagerly to find the
            producing op.
        guard: GuardOptions, optional (library only; the command derives it from `on_nonfinite` and `mode`).
            What a non-finite step does beyond stop or continue (`skip`, `rollback`); None: `keep_going` decides.
    """

    json_out: str | None = option(None, "--json", JSON_HELP, show_default=False)
    trace_path: Path | None = option(None, "--trace", "JSON-lines trace file (default: "
                                                      "nanscope-runs/<spec>/trace.jsonl).")
    keep_going: bool = option(False, "--keep-going", "Continue past the first non-finite step.")
    on_nonfinite: str | None = option(None, "--on-nonfinite", "stop (default), continue (= --keep-going), skip "
                                                              "(undo the step, go on) or rollback (an earlier state, "
                                                              "a lower learning rate); docs/guard.md.")
    mode: str = option("full", "--mode", "full (default) or sentinel: the scalars on most steps, the full statistics "
                                         "on every 100th and around events (docs/guard.md).")
    strict: bool = option(False, "--strict", STRICT_HELP)
    show_all: bool = option(False, "--all", TABLES_HELP)
    save_repro: Path | None = option(None, "--save-repro",
                                     "Save the first non-finite step to DIR for `nanscope replay DIR`.")
    verify: bool = option(False, "--verify", "Re-run with each fix nanscope can apply and mark it verified.")
    tensorboard: Path | None = option(None, "--tensorboard", "Write per-step scalars to this TensorBoard log DIR.")
    plot: Path | None = option(None, "--plot", "Draw loss, grad norm and the worst layers to FILE (.png, .svg or "
                                               ".pdf; needs nanscope\\[plot]).")
    unsafe: bool = option(False, "--unsafe", "Load a .keras file without Keras safe mode (Lambda layers run stored "
                                             "Python code): only for files you trust.")
    keep_steps: int = option(DEFAULT_KEEP, "--keep-steps", "Keep every layer's and variable's row for the first N "
                                                           "steps, the last N and N around the first NaN (default "
                                                           "500).", minimum=1)
    sample_steps: int = option(DEFAULT_SAMPLE, "--sample-steps", "...and for an even sample of N steps in between "
                                                                 "(default 500).", minimum=2)
    trace_full: bool = option(False, "--trace-full", "Write every step's full row to the trace (by default: every "
                                                     "step's scalars, full rows of the kept steps).")
    on_step: Callable[..., Any] | None = None
    forensics: bool = True
    guard: Any = None


@dataclass(frozen=True)
class CompareClippingOptions(SpecOverrides):
    """How to run compare-clipping (`nanscope compare-clipping`).

    Args:
        steps, lr, batch_size, seed: the spec's fields overridden (`SpecOverrides`).
        strategies: str, optional. Comma-separated strategies (`nanscope.run.clipping.strategies`); None: the
            default set.
        json_out: str, optional. Where the command writes the JSON report ("-": stdout).
        plot: Path, optional. Draw the loss curves to this image (matplotlib).
    """

    strategies: str | None = option(
        None, "--strategies",
        "Comma-separated: none, clipvalue[=V], clipnorm[=C], global_clipnorm[=C], manual_clip_by_norm[=C], "
        "manual_clip_by_global_norm[=C], auto. Without a threshold it is derived from the unclipped run. "
        "Default: none,clipvalue,clipnorm,global_clipnorm,auto.", show_default=False)
    json_out: str | None = option(None, "--json", JSON_HELP, show_default=False)
    plot: Path | None = option(None, "--plot", "Write the loss curves to FILE (.png, .svg or .pdf; needs "
                                               "nanscope\\[plot]).")


@dataclass(frozen=True)
class CheckDataOptions:
    """How to run check-data (`nanscope check-data`).

    Args:
        json_out: str, optional. Where the command writes the JSON report ("-": stdout).
        target: str, optional. The target column (csv) or feature (TFRecord) of a data file.
        loss: str, optional. The loss to check the labels against (default: the spec's).
        classes: int, optional. The number of classes the labels should span.
        sample: int, optional. Scan a uniform sample of this many rows instead of all.
        show_all: bool, default False. Show every column.
    """

    json_out: str | None = option(None, "--json", JSON_HELP, show_default=False)
    target: str | None = option(None, "--target", "Target column (csv) or feature (TFRecord) of a data file.")
    loss: str | None = option(None, "--loss", "Loss to check the labels against (default: the spec's).")
    classes: int | None = option(None, "--classes", "Number of classes the labels should span.")
    sample: int | None = option(None, "--sample", "Scan a uniform sample of N rows instead of all.", minimum=1)
    show_all: bool = option(False, "--all", "Show every column (default: the flagged ones first, up to 40).")


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay a repro folder (`nanscope replay`, `nanscope.replay.replay_repro`).

    Args:
        json_out: str, optional. Where the command writes the JSON report ("-": stdout).
        verify: bool, default False. Apply each fix nanscope can apply to the saved step.
        unsafe: bool, default False. Load a bundle's model without Keras safe mode.
    """

    json_out: str | None = option(None, "--json", JSON_HELP, show_default=False)
    verify: bool = option(False, "--verify", "Apply each fix nanscope can apply to the saved step and say whether "
                                             "it stays finite.")
    unsafe: bool = option(False, "--unsafe", "Load a bundle's model without Keras safe mode (Lambda layers run "
                                             "stored Python code): only for bundles you trust.")


@dataclass(frozen=True)
class ReportOptions:
    """How to redraw a report from its trace (`nanscope report`).

    Args:
        json_out: str, optional. Where the command writes the JSON report ("-": stdout).
        strict: bool, default False. Exit 1 on warning-level findings too.
        show_all: bool, default False. Show every row of the layer and variable tables.
    """

    json_out: str | None = option(None, "--json", JSON_HELP, show_default=False)
    strict: bool = option(False, "--strict", STRICT_HELP)
    show_all: bool = option(False, "--all", TABLES_HELP)
