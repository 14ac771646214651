"""trace-steps under `distribute: mirrored` with the guard: the verdicts on the first non-finite step, a skip.

Runs each scenario named in argv (SCENARIOS' keys) in this one process and prints one JSON object: per trace
scenario its first_nonfinite, notes, interventions and every step's loss. Run with NANSCOPE_CPU_REPLICAS=2 (two
replicas on a CPU-only machine). So that TensorFlow starts once for them all (7 s of CPU a process), SCENARIOS
also holds the fits of fit_guard.py and fit_callback.py and `cli-*`: trace-steps runs through the CLI's own
`main` (exit code and JSON report), in the working folder.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fit_callback import fit_callback  # noqa: E402
from fit_guard import FITS  # noqa: E402
from models import FAULT  # noqa: E402

import nanscope.cli  # noqa: E402

from nanscope.guard import GuardOptions  # noqa: E402
from nanscope.run.trace import run_trace  # noqa: E402
from nanscope.spec.load import parse_spec  # noqa: E402
from nanscope.spec.options import TraceOptions  # noqa: E402

ADAM = {"name": "adam", "learning_rate": 0.01}


def trace(model, data, optimizer, steps, guard, on_step=None, **args):
    document = {"model": {"factory": f"{HERE / 'models.py'}:{model}"},
                "data": {"factory": f"{HERE / 'models.py'}:{data}", "args": args, "batch_size": 16, "shuffle": False},
                "train": {"loss": "mse", "optimizer": optimizer, "steps": steps, "seed": 0, "distribute": "mirrored"}}
    spec = parse_spec(document, source=str(HERE / "verdicts.yaml"))
    report = run_trace(spec, TraceOptions(trace_path=Path(os.getcwd()) / "trace.jsonl", keep_going=True,
                                          guard=guard, on_step=on_step)).to_json()
    return {key: report[key] for key in ("first_nonfinite", "notes", "interventions")} | {
        "losses": [step["loss"] for step in report["steps"]]}


def arm_at(step, replica):
    def on_step(record):
        if record.step == step:
            os.environ[FAULT] = str(replica)
    return on_step


def cli(name, spec, *options):
    """`nanscope trace-steps SPEC OPTIONS --json` through the CLI's `main`, its report printed to stderr: the exit
    code and the JSON report. `main` ends the process once TensorFlow is loaded (`exit_now`): here it raises."""
    report = Path.cwd() / f"{name}.json"
    sys.argv = ["nanscope", "trace-steps", str(HERE / spec), *options, "--json", str(report),
                "--trace", str(Path.cwd() / f"{name}.jsonl")]
    exit_now, nanscope.cli.exit_now = nanscope.cli.exit_now, sys.exit
    try:
        with contextlib.redirect_stdout(sys.stderr):
            nanscope.cli.main()
    except SystemExit as done:
        return {"exit": done.code, "report": json.loads(report.read_text())}
    finally:
        nanscope.cli.exit_now = exit_now
    raise AssertionError("nanscope.cli.main returned")


SCENARIOS = {
    # Row 12 of step 3's batch: replica 1's half. The ring keeps the states before steps 0 and 2.
    "planted": lambda: trace("mlp", "nan_at", ADAM, 6, GuardOptions(on_nonfinite="continue", snapshot_every=2)),
    # Replica 1's flaky layer returns NaN once, at step 3.
    "planted-unguarded": lambda: trace("mlp", "nan_at", ADAM, 6, None),
    "transient": lambda: trace("flaky_mlp", "regression", ADAM, 5, GuardOptions(on_nonfinite="continue",
                                                                                  snapshot_every=2),
                               on_step=arm_at(2, 1)),
    "diverging": lambda: trace("mlp", "steep", {"name": "sgd", "learning_rate": 0.5}, 12,
                               GuardOptions(on_nonfinite="continue", snapshot_every=2)),
    # The poisoned batch (step 3, and step 7 in the next pass) skipped, under Adam.
    "skip": lambda: trace("mlp", "nan_at", ADAM, 8, GuardOptions(on_nonfinite="skip")),
    # The run without that batch: rows 48-63 left out.
    "clean": lambda: trace("mlp", "regression", ADAM, 6, None, rows=48),
    "cli-healthy": lambda: cli("cli-healthy", "healthy.yaml"),
    "cli-nan": lambda: cli("cli-nan", "nan-second-half.yaml"),
    "cli-sentinel": lambda: cli("cli-sentinel", "healthy.yaml", "--mode", "sentinel"),
    "fit-callback": fit_callback,
    **FITS,
}

names = sys.argv[1:]  # before `cli` sets sys.argv for the CLI
print(json.dumps({name: SCENARIOS[name]() for name in names}))
