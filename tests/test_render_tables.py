"""Shortened tables say so, keep the rows the findings name, and `--all` shows every row.

Summaries agree with the JSON.
"""

import io
import json

import numpy as np
from rich.console import Console
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.engine.records import LayerStats, StepRecord, VariableStats
from nanscope.store.history import StepHistory
from nanscope.render.trace_report import WORST_SHOWN, render_trace_report
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.rules.catalogue import recommend

LAYERS = [(f"block{i}", "Dense") for i in range(10)]
VARIABLES = [f"block{i}/kernel" for i in range(10)]


def report_with_a_small_failing_layer():
    """Ten layers and variables; layer block9 (the smallest outputs) fed the failing op, block8 is a finding's."""
    layers = [LayerStats(10.0 ** (9 - i), 1.0, 0, 0.0, 0.0) for i in range(10)]
    variables = [VariableStats(float(i + 1), 0, 1.0, 1e-3, 0) for i in range(10)]
    record = StepRecord(step=0, batch_rows=8, loss=1.0, data_loss=1.0, grad_global_norm=1.0,
                        applied_grad_global_norm=1.0, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                        loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0, layers=layers, variables=variables)
    first = FirstNonfinite(step=1, phase="backward", layer="block9", variable="block0/kernel")
    finding = recommend("bounded-activation", "warning", ["layer block8 grew"], data={"layer": "block8"})
    history = StepHistory(len(LAYERS), len(VARIABLES))
    history.add(record)
    return TraceReport(run={}, layers=LAYERS, layer_order=[n for n, _ in LAYERS], variables=VARIABLES,
                       history=history, first_nonfinite=first, recommendations=[finding])


def text(report, show_all=False):
    console = Console(width=120, file=io.StringIO(), record=True, color_system=None)
    render_trace_report(report, console, show_all=show_all)
    return console.export_text()


def test_tables_keep_the_named_rows_and_say_how_many_more_there_are():
    shown = text(report_with_a_small_failing_layer())
    for name in ("block9", "block8", "block0/kernel"):  # named by the first non-finite value or a finding
        assert f" {name} " in shown
    assert " block7 " not in shown and "block7/kernel" in shown  # block7's kernel ranks in the top 6
    assert f"{10 - WORST_SHOWN - 2} more layers (--all)" in shown
    assert f"{10 - WORST_SHOWN - 1} more variables (--all)" in shown


def test_all_shows_every_row():
    shown = text(report_with_a_small_failing_layer(), show_all=True)
    assert all(f" {name} " in shown for name, _ in LAYERS) and all(name in shown for name in VARIABLES)
    assert "more layers" not in shown and "more variables" not in shown


def test_the_variables_table_is_sorted_as_its_header_says():
    shown = text(report_with_a_small_failing_layer(), show_all=True)
    assert "variables (non-finite first, then largest max grad" in shown
    order = [shown.index(f"{name} ") for name in reversed(VARIABLES)]  # block9 has the largest max grad
    assert order == sorted(order)


def test_check_data_summary_agrees_with_the_json(tmp_path):
    x = np.random.default_rng(0).standard_normal((50, 64)).astype(np.float32) * 1000
    np.savez(tmp_path / "wide.npz", x=x, y=x[:, 0])
    out = tmp_path / "scan.json"
    result = CliRunner().invoke(app, ["check-data", str(tmp_path / "wide.npz"), "--json", str(out)],
                                env={"COLUMNS": "120"})
    document = json.loads(out.read_text())
    flagged = [c for c in document["inputs"] if c["scale"]]
    assert len(flagged) == 64
    assert "24 more columns, 24 of them flagged: 24 large scale (--all)" in " ".join(result.stdout.split())
    assert "without problems" not in result.stdout
    every = CliRunner().invoke(app, ["check-data", str(tmp_path / "wide.npz"), "--all"], env={"COLUMNS": "120"})
    assert all(f"x[{i}] " in every.stdout for i in range(64)) and "more columns" not in every.stdout


def test_all_reaches_the_tables_through_trace_steps_and_report(tmp_path):
    from pathlib import Path

    import yaml

    factories = Path(__file__).parent / "bad_inputs" / "factories.py"
    spec = {"model": {"factory": f"{factories}:deep"}, "data": {"factory": f"{factories}:arrays", "batch_size": 8},
            "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 2}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    trace = tmp_path / "t.jsonl"
    runner, wide = CliRunner(), {"COLUMNS": "120"}
    short = runner.invoke(app, ["trace-steps", str(tmp_path / "spec.yaml"), "--trace", str(trace)], env=wide)
    assert short.exit_code == 0, short.output
    assert "3 more layers (--all)" in short.stdout and "12 more variables (--all)" in short.stdout
    every = runner.invoke(app, ["report", str(trace), "--all"], env=wide)
    assert "more layers" not in every.stdout and "more variables" not in every.stdout
    assert all(f"d{i}/kernel" in every.stdout for i in range(8))
