"""Every report stays readable at 80 columns: no number is cut, no name breaks mid-word, no table drops a
column, wrapped bullets stay indented.

Each report is made by a real run (or scan) and rendered to a recording console 80
columns wide; the numbers the tables show must appear whole in the text, and the names
(layers, variables, columns, fixes, strategies) whole or broken only after _ . / - =.
"""

import io
import os
import re
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from rich.console import Console

from nanscope.render.format import NAME_BREAKS, fmt, name_lines
from nanscope.spec.load import apply_overrides, load_spec, parse_spec

CONFIGS = Path(__file__).parent.parent / "configs"
SPECS = Path(__file__).parent / "specs"
WIDTH = 80


def rendered(draw, *args, **kwargs):
    console = Console(width=WIDTH, file=io.StringIO(), record=True, color_system=None, soft_wrap=False)
    draw(*args, console, **kwargs)
    return console.export_text()


def assert_readable(text, numbers, names=()):
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    assert "…" not in text, next(line for line in lines if "…" in line)
    for number in numbers:
        assert number in text, f"{number!r} is cut or missing"
    names = set(names)
    for name in names:
        assert name in text or all(part in text for part in name_lines(name, 8).splitlines()), f"{name!r} is missing"
        for line in lines:  # a name cut mid-word shows a head whose next character would be a letter or digit
            for cut in range(3, len(name)):
                head, rest = name[:cut], name[cut:]
                if head[-1] not in NAME_BREAKS and rest[0] not in "[" and f" {head} " in f" {line} " \
                        and name not in line and head not in names:
                    assert not rest[0].isalnum() or not head[-1].isalnum(), f"{name!r} broken as {head!r}: {line!r}"


@pytest.fixture(scope="module")
def exploding(tmp_path_factory):
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    spec = load_spec(CONFIGS / "exploding-regression.yaml")
    return run_trace(spec, TraceOptions(trace_path=tmp_path_factory.mktemp("t") / "t.jsonl"))


def table_numbers(report):
    numbers = [fmt(row[key]) for row in report.variable_summaries()
               for key in ("max_grad_norm", "last_grad_norm", "max_update_ratio", "weight_norm_last")]
    numbers += [fmt(row[key]) for row in report.layer_summaries() for key in ("max_abs", "mean_abs_last",
                                                                             "loss_term_last")]
    return numbers


def table_names(report):
    return [row["name"] for row in report.variable_summaries()] + [row["name"] for row in report.layer_summaries()]


def test_the_trace_report_fits_80_columns(exploding):
    from nanscope.render.trace_report import render_trace_report

    text = rendered(render_trace_report, exploding)
    assert_readable(text, table_numbers(exploding), table_names(exploding))
    assert f"steps      {exploding.steps_run} of 200" in text


def test_the_float16_layer_table_fits_80_columns_with_its_dtype_column(tmp_path):
    """mixed_float16 adds a dtype column to the layer table: every column still shows, no number is split."""
    from nanscope.render.trace_report import render_trace_report
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    spec = parse_spec({
        "model": {"factory": f"{SPECS / 'precision_models.py'}:exp_late_overflow"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16, "shuffle": False,
                 "args": {"growth": 3.0}},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 4, "seed": 0,
                  "mixed_precision": "mixed_float16"},
    }, source=str(tmp_path / "spec.yaml"))
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl", keep_going=True))
    assert report.run["layer_dtypes"]["hidden"] == "float16"
    text = rendered(render_trace_report, report)
    layers = text[text.index("layers ("):text.index("variables (")]
    assert "dtype" in layers and "float16" in layers and "NaN" in layers and "steps" in layers
    assert_readable(text, table_numbers(report), table_names(report))


def test_the_verify_tables_fit_80_columns(tmp_path):
    """--verify puts a table of six columns under each recommendation, inside the panel: every loss whole."""
    from nanscope.render.trace_report import render_trace_report
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    spec = apply_overrides(load_spec(CONFIGS / "exploding-regression.yaml"), steps=12)
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl", verify=True))
    rows = [row for rec in report.recommendations for row in rec.verification]
    assert len(rows) >= 3
    shown = ("judged_loss", "baseline") if "baseline" in rows[0] else ("final_loss", "best_loss",
                                                                         "unfixed_final_loss", "unfixed_best_loss")
    numbers = [fmt(row[key]) for row in rows for key in shown if key in row]
    text = rendered(render_trace_report, report)
    assert_readable(text, numbers, [row["fix"] for row in rows] + table_names(report))
    assert "final" in text and "loss" in text


def test_wrapped_evidence_lines_stay_indented_under_their_bullet(exploding):
    from nanscope.render.trace_report import render_trace_report

    lines = rendered(render_trace_report, exploding).splitlines()
    start = next(i for i, line in enumerate(lines) if "   - " in line and len(line.strip("│ ")) > 60)
    bullet = lines[start].index("- ")
    follow = lines[start + 1]
    assert "- " not in follow[: bullet + 2]
    assert follow[bullet + 2] != " " and follow[:bullet + 2].strip("│ ") == "", (lines[start], follow)


def test_the_clipping_report_fits_80_columns():
    from nanscope.run.clipping import compare_clipping, parse_strategies
    from nanscope.render.clipping_report import render_clipping_report

    spec = apply_overrides(load_spec(CONFIGS / "exploding-regression.yaml"), steps=30)
    report = compare_clipping(spec, parse_strategies("none,clipvalue,manual_clip_by_global_norm,global_clipnorm"))
    text = rendered(render_clipping_report, report)
    numbers = [fmt(run.result.final_loss) for run in report.runs] + [fmt(run.result.val_loss) for run in report.runs]
    numbers += [fmt(run.strategy.threshold) for run in report.runs]
    assert_readable(text, numbers)
    assert "took" in text and "loss curve" in text


def test_check_data_column_names_break_only_at_word_boundaries(tmp_path):
    """A csv of long column names: names that fit stay whole; the longest ones break after an underscore."""
    from nanscope.checkdata import scan_data
    from nanscope.render.data_report import render_data_report

    rng = np.random.default_rng(0)
    names = ["tenure_months", "monthly_charges_usd", "total_charges_usd", "support_calls",
             "customer_lifetime_value_estimate_in_usd", "churn"]
    values = np.column_stack([rng.integers(0, 72, 300), rng.normal(65, 30, 300), rng.lognormal(7, 1, 300),
                              rng.poisson(2, 300), rng.normal(5e4, 2e4, 300), rng.integers(0, 2, 300)])
    lines = [",".join(names)] + [",".join(f"{v:.6g}" for v in row) for row in values]
    (tmp_path / "churn.csv").write_text("\n".join(lines) + "\n")
    scan = scan_data(tmp_path / "churn.csv", target="churn")
    text = rendered(render_data_report, scan)
    numbers = [f"{getattr(c, key):.3g}" for c in scan.inputs for key in ("min", "max", "mean", "std")]
    assert_readable(text, numbers, names)
    assert " tenure_months " in text and " support_calls " in text  # short enough to stay whole
    lines = text[:text.index("target")].splitlines()  # the input table
    for name in names[1:3] + names[4:5]:  # too long for the column: broken, but only after an underscore
        assert not any(name in line for line in lines)
        start = next(i for i, line in enumerate(lines) if line.startswith(" " + name.split("_")[0] + "_"))
        parts, joined = [], ""
        while joined != name:
            parts.append(lines[start + len(parts)][1:].split(" ")[0])
            joined = "".join(parts)
            assert name.startswith(joined), (name, parts)
        assert all(part.endswith("_") for part in parts[:-1]) and len(parts) > 1, parts


def test_name_lines_breaks_after_separators_and_cuts_only_an_unbreakable_part():
    assert name_lines("tenure_months", 8) == "tenure_\nmonths"
    assert name_lines("dense_1/kernel", 9) == "dense_1/\nkernel"
    assert name_lines("x[12]", 10) == "x[12]"
    assert name_lines("abcdefghij", 4) == "abcd\nefgh\nij"


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


def test_an_unnamed_loss_and_an_open_step_count_read_as_plain_text():
    """A user's own step whose loss takes a log of negative values: no loss name, no requested step count."""
    import nanscope
    from nanscope.render.trace_report import render_trace_report
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.math.log(model(x, training=True) - y))  # y = 100: a log of negatives
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    traced = nanscope.instrument(model, optimizer, verbose=0)(train_step)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with pytest.raises(nanscope.NonFiniteError):
        traced(x, np.full((8, 1), 100.0, np.float32))
    report = traced.nanscope.report
    assert report.first_nonfinite.loss == "the loss" and report.run["steps_requested"] is None
    text = rendered(render_trace_report, report)
    assert "Log is part of the loss, outside any layer" in text
    assert "the loss the loss" not in text and "loss the loss" not in text and "of None" not in text
    assert re.search(r"│ steps +1 +│", text), text


def test_the_scale_finding_names_the_farthest_features_and_counts_the_rest(tmp_path):
    """Six far features, the farthest last in the array: the five named are the farthest, then "and 1 more"."""
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 6)) * np.array([20.0, 30.0, 40.0, 50.0, 60.0, 5000.0])).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=rng.standard_normal((64, 1)).astype(np.float32))
    spec = parse_spec({"model": {"factory": f"{SPECS / 'models.py'}:mlp", "args": {"features": 6}},
                       "data": {"path": str(tmp_path / "d.npz"), "batch_size": 16, "shuffle": False},
                       "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 1e-6}, "steps": 2,
                                 "seed": 0}}, source=str(tmp_path / "spec.yaml"))
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))
    line = next(r for r in report.recommendations if r.id == "normalize-inputs").evidence[0]
    assert line.startswith("6 input feature(s) far from unit scale: x[5] (std ") and line.endswith(", and 1 more")
    assert "x[0]" not in line and all(f"x[{i}]" in line for i in range(1, 6))
