"""Every report stays readable at 80 columns: no number is cut, no table drops a column, wrapped bullets stay indented.

Each report is made by a real run (or scan) and rendered to a recording console 80
columns wide; the numbers the tables show must appear whole in the text.
"""

import io
import os
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from rich.console import Console

from nanscope.render.format import fmt
from nanscope.spec import apply_overrides, load_spec

CONFIGS = Path(__file__).parent.parent / "configs"
WIDTH = 80


def rendered(draw, *args, **kwargs):
    console = Console(width=WIDTH, file=io.StringIO(), record=True, color_system=None, soft_wrap=False)
    draw(*args, console, **kwargs)
    return console.export_text()


def assert_readable(text, numbers):
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    assert "…" not in text, next(line for line in lines if "…" in line)
    for number in numbers:
        assert number in text, f"{number!r} is cut or missing"


@pytest.fixture(scope="module")
def exploding(tmp_path_factory):
    from nanscope.trace import TraceOptions, run_trace

    spec = load_spec(CONFIGS / "exploding-regression.yaml")
    return run_trace(spec, TraceOptions(trace_path=tmp_path_factory.mktemp("t") / "t.jsonl"))


def test_the_trace_report_fits_80_columns(exploding):
    from nanscope.render.trace_report import render_trace_report

    text = rendered(render_trace_report, exploding)
    numbers = [fmt(row["max_grad_norm"]) for row in exploding.variable_summaries()]
    numbers += [fmt(row["max_abs"]) for row in exploding.layer_summaries()]
    assert_readable(text, numbers)


def test_wrapped_evidence_lines_stay_indented_under_their_bullet(exploding):
    from nanscope.render.trace_report import render_trace_report

    lines = rendered(render_trace_report, exploding).splitlines()
    start = next(i for i, line in enumerate(lines) if "   - " in line and len(line.strip("│ ")) > 60)
    bullet = lines[start].index("- ")
    follow = lines[start + 1]
    assert "- " not in follow[: bullet + 2]
    assert follow[bullet + 2] != " " and follow[:bullet + 2].strip("│ ") == "", (lines[start], follow)


def test_the_clipping_report_fits_80_columns():
    from nanscope.clipping import compare_clipping, parse_strategies
    from nanscope.render.clipping_report import render_clipping_report

    spec = apply_overrides(load_spec(CONFIGS / "exploding-regression.yaml"), steps=30)
    report = compare_clipping(spec, parse_strategies("none,clipvalue,manual_clip_by_global_norm,global_clipnorm"))
    text = rendered(render_clipping_report, report)
    numbers = [fmt(run.result.final_loss) for run in report.runs] + [fmt(run.result.val_loss) for run in report.runs]
    numbers += [fmt(run.strategy.threshold) for run in report.runs]
    assert_readable(text, numbers)
    assert "took" in text and "loss curve" in text


def test_the_check_data_report_fits_80_columns(tmp_path):
    from nanscope.checkdata import scan_data
    from nanscope.render.data_report import render_data_report

    x = np.random.default_rng(0).standard_normal((50, 6)) * 1e4
    x[3, 1], x[:, 2], x[4, 3] = np.nan, 1.0, -np.inf
    np.savez(tmp_path / "d.npz", x=x.astype(np.float32), y=x[:, 0].astype(np.float32))
    scan = scan_data(tmp_path / "d.npz")
    text = rendered(render_data_report, scan)
    numbers = [f"{c.min:.3g}" for c in scan.inputs if np.isfinite(c.min)] + [f"{c.std:.3g}" for c in scan.inputs]
    assert_readable(text, numbers)
    assert "large scale" in text and "constant" in text


def test_the_callback_header_states_rows_and_batch_size_instead_of_none():
    from nanscope.keras import NanScope
    from nanscope.render.trace_report import render_trace_report
    from nanscope.runtime import tensorflow

    _, keras = tensorflow()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
    scope = NanScope(console=Console(file=io.StringIO()))
    model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0, callbacks=[scope])
    assert (scope.report.run["train_rows"], scope.report.run["batch_size"]) == (100, 16)  # 6 batches of 16 and one of 4
    header = rendered(render_trace_report, scope.report).split("over steps")[0]
    assert "train 100 rows" in header and "batch 16" in header and "None" not in header


def test_bullets_are_plain_text_not_rich_markup():
    from nanscope.render.format import hanging

    console = Console(width=WIDTH, file=io.StringIO(), record=True, color_system=None)
    console.print(hanging("   - ", "x['numbers'][1] and [bold]y[/bold] and [red]"))
    assert "x['numbers'][1] and [bold]y[/bold] and [red]" in console.export_text()
