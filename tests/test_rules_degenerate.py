"""Every rule in the catalogue, run on degenerate histories: zeros, denormals, constants, one step, all-NaN columns.

A run that fits its data perfectly ends with a loss and a gradient norm of exactly 0;
a float16 run can leave denormals; a trace can hold NaN in a column. None of these
may make a rule raise: the run would end in a traceback instead of its report.
Each detector is called directly here, so an exception fails the test instead of
being turned into a note.
"""

import math
import os
import re

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import keras
import numpy as np
import pytest

from nanscope.engine.records import LayerStats, StepRecord, VariableStats
from nanscope.store.history import StepHistory
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.rules.catalogue import RULES
from nanscope.rules.diagnose import detectors, diagnose, projected_overflow_step
from nanscope.rules.evidence import RunEvidence, feature_scales, target_scales
from nanscope.rules.facts import facts_from
from nanscope.rules.registry import fallbacks

NAN = math.nan
# Values a healthy or a broken run can leave in any column of its records.
DEGENERATE = {
    "zeros": 0.0,
    "float64-denormal": 5e-324,
    "float32-denormal": 1e-45,
    "constant": 1.0,
    "float32-max": float(np.finfo(np.float32).max),
    "all-nan": NAN,
    "inf": math.inf,
}
STEP_COUNTS = (1, 2, 12)
# A statistic quoted as evidence must be a number: "std nan" or "mean |y| inf" says nothing.
QUOTED_NONFINITE = re.compile(r"\b(std|mean \|y\|) -?(nan|inf)\b")
CHECK_DATA_RULES = {"fix-labels", "drop-constant-features"}  # fired by check-data's scan, tested below


def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(2, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))


MODEL = model()
LAYERS = [("hidden", "Dense"), ("head", "Dense")]
VARIABLES = ["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]


def record(step, value, *, nan_columns=False, loss_scale=None):
    """A record whose every measured float is `value` (finite loss and norm unless `value` is not)."""
    column = NAN if nan_columns else value
    layers = [LayerStats(column, column, 0, column, column, underflow_fraction=column) for _ in LAYERS]
    variables = [VariableStats(column, 0, column, column, 0) for _ in VARIABLES]
    return StepRecord(step=step, batch_rows=8, loss=value, data_loss=column, grad_global_norm=value,
                      applied_grad_global_norm=column, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                      loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0, layers=layers, variables=variables,
                      loss_scale=loss_scale, update_skipped=loss_scale is not None)


def report_of(records, first=None, dtype="float32", lr=0.01, epsilon=0.0):
    run = {"optimizer_config": {"learning_rate": lr, "epsilon": epsilon}, "loss_scaling": dtype == "float16",
           "layer_dtypes": {name: dtype for name, _ in LAYERS}}
    history = StepHistory(len(LAYERS), len(VARIABLES))
    for one in records:
        history.add(one)
    return TraceReport(run=run, layers=list(LAYERS), layer_order=[n for n, _ in LAYERS], variables=list(VARIABLES),
                       history=history, first_nonfinite=first)


def evidence_of(value, rows=8):
    """The RunEvidence of a run whose inputs and regression targets all hold `value`."""
    x = np.full((rows, 3), value, dtype=np.float64)
    y = np.full((rows, 1), value, dtype=np.float32)
    return RunEvidence(keras_model=MODEL, features=feature_scales(x, ["a", "b", "c"]),
                       targets=target_scales([(None, "mse", y)]), batch_rows=lambda step: np.arange(rows))


def firsts(value):
    """A first non-finite value in every phase, with each producing op the rules know and degenerate operands."""
    operand = {"min": value, "max": value, "zero_fraction": value, "negative_fraction": value}
    found = [None]
    for phase in ("data", "forward", "loss", "backward", "update"):
        for op in ("Log", "Exp", "RealDiv", "Sqrt", "SqrtGrad", "AssignSubVariableOp", None):
            for dtype in ("float16", "float32", None):
                inputs = {"op": op, "dtype": dtype, **operand} if dtype else {}
                found.append(FirstNonfinite(step=0, phase=phase, layer="hidden", layer_class="Dense", op=op,
                                            inputs=inputs, source="model.py:3" if op else None))
        masked = {"masked_rows": 1, "softmax_rows": 1, "batch_rows": [0, 99], "positions": [[0]],
                  "fill": {"op": "SelectV2", "source": None}}
        found.append(FirstNonfinite(step=0, phase=phase, op="Softmax", inputs={"dtype": "float16", **operand},
                                    context=masked))
        trap = {"discarded_by": {"op": "SelectV2", "source": None}, "forward_nonfinite": None}
        found.append(FirstNonfinite(step=0, phase=phase, op="RealDiv", inputs={"op": "Log", **operand}, context=trap))
    return found


HISTORIES = [
    pytest.param(name, value, steps, nan_columns, id=f"{name}-{steps}step{'-nancols' if nan_columns else ''}")
    for name, value in DEGENERATE.items() for steps in STEP_COUNTS for nan_columns in (False, True)
]


@pytest.mark.parametrize("name,value,steps,nan_columns", HISTORIES)
def test_every_detector_survives_a_degenerate_history(name, value, steps, nan_columns):
    evidence = evidence_of(value)
    for dtype, scale in (("float32", None), ("float16", value)):
        records = [record(s, value, nan_columns=nan_columns, loss_scale=scale) for s in range(steps)]
        for first in firsts(value):
            report = report_of(records, first, dtype=dtype, lr=value if math.isfinite(value) else 0.01)
            facts = facts_from(report, evidence)
            for _, detector in detectors() + fallbacks():
                for score, rec in detector(facts):  # raises: the test fails
                    assert math.isfinite(score) and rec.id in RULES
                    assert not any(QUOTED_NONFINITE.search(line) for line in rec.evidence), rec.evidence


def test_every_catalogue_rule_is_run_here_or_by_check_data():
    covered = {rule for rule_ids, _ in detectors() + fallbacks() for rule in rule_ids}
    assert covered | CHECK_DATA_RULES == set(RULES)


def perfect_fit_history(last_norm):
    """A gradient norm that doubles for 11 steps, then a step that fits the data exactly: norm and loss 0."""
    records = [record(s, 2.0 ** s) for s in range(11)]
    for r in records:
        r.variables = [VariableStats(1.0, 0, 1.0, 1e-3, 0) for _ in VARIABLES]
    records.append(record(11, last_norm))
    records[-1].variables = [VariableStats(last_norm, 0, 1.0, 0.0, 0) for _ in VARIABLES]
    return records


@pytest.mark.parametrize("last_norm", [0.0, 5e-324, 1e-45])
def test_a_norm_that_ends_at_zero_or_a_denormal_gives_no_growth_projection_and_no_traceback(last_norm):
    report = report_of(perfect_fit_history(last_norm))
    recommendations = diagnose(report, evidence_of(1.0))
    assert not any("failed while the report was finished" in note for note in report.notes), report.notes
    for rec in recommendations:
        assert all("inf" not in line.split("around step")[-1] for line in rec.evidence if "overflows" in line)


def test_the_projection_is_none_where_it_cannot_be_said():
    assert projected_overflow_step(10, 0.0, 2.0) is None
    assert projected_overflow_step(10, 5e-324, 2.0) is None  # FLOAT32_MAX / 5e-324 overflows float64
    assert projected_overflow_step(10, 1.0, 1.0) is None
    assert projected_overflow_step(10, math.nan, 2.0) is None
    # 2**128 > float32 max > 2**127: a norm of 1 doubling each step overflows about 128 steps on.
    assert 137 < projected_overflow_step(10, 1.0, 2.0) < 138


def test_a_rule_that_raises_is_left_out_with_a_note_naming_it():
    report = report_of([record(s, 1.0) for s in range(3)])
    evidence = evidence_of(1.0)
    evidence.features, evidence.targets = [None], [None]  # the scale rules cannot read these: they raise
    recommendations = diagnose(report, evidence)
    notes = [n for n in report.notes if "failed while the report was finished" in n]
    assert any(n.startswith("rule normalize-targets failed") for n in notes), report.notes
    assert any(n.startswith("rule normalize-inputs failed") for n in notes), report.notes
    assert all(r.id not in ("normalize-targets", "normalize-inputs") for r in recommendations)


@pytest.mark.parametrize("name,value", list(DEGENERATE.items()))
@pytest.mark.parametrize("rows", [1, 16])
def test_check_data_rules_survive_degenerate_columns(name, value, rows, tmp_path):
    from nanscope.checkdata import scan_data

    x = np.full((rows, 3), value, dtype=np.float32)
    x[:, 1] = NAN  # an all-NaN column beside the degenerate ones
    for y in (np.full((rows,), value, dtype=np.float32), np.zeros((rows,), dtype=np.int64)):
        path = tmp_path / f"{name}.npz"
        np.savez(path, x=x, y=y)
        for loss in ("mse", "sparse_categorical_crossentropy", "binary_crossentropy"):
            scan = scan_data(path, loss=loss, classes=2)
            assert scan.exit_code() in (0, 1)
            assert all(r.id in RULES for r in scan.recommendations)


def test_a_run_whose_rule_raises_still_writes_its_json_and_keeps_its_exit_code(tmp_path, monkeypatch):
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    import nanscope.rules.clip_gradients as clip_gradients
    from nanscope.cli import app

    def broken(facts):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(clip_gradients, "detect", broken)  # a bug in one rule, nothing else changed
    spec = Path(__file__).parent.parent / "configs" / "exploding-regression.yaml"
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app,
                                ["trace-steps", str(spec), "--json", str(out), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 1, result.output  # the run went non-finite: it earned exit 1
    document = json.loads(out.read_text())
    assert document["status"] == "nonfinite"
    assert "clip-gradients" not in [r["id"] for r in document["recommendations"]]
    assert document["recommendations"], "the other rules still fire"
    assert any(n.startswith("rule clip-gradients failed while the report was finished (ZeroDivisionError")
               for n in document["notes"])
    assert "rule clip-gradients failed" in " ".join(result.stdout.split())


def test_a_report_that_cannot_be_printed_still_writes_its_json_and_keeps_its_exit_code(tmp_path, monkeypatch):
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    import nanscope.render.trace_report as renderer
    from nanscope.cli import app

    def broken(report, console, show_all=False):
        raise ValueError("a renderer bug")

    monkeypatch.setattr(renderer, "render_trace_report", broken)
    spec = Path(__file__).parent.parent / "configs" / "exploding-regression.yaml"
    out = tmp_path / "report.json"
    argv = ["trace-steps", str(spec), "--json", str(out), "--trace", str(tmp_path / "t.jsonl")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1, result.output
    assert json.loads(out.read_text())["status"] == "nonfinite"
    assert result.stderr.strip().splitlines()[-1].startswith(
        "nanscope: the printed report failed while the report was finished (ValueError: a renderer bug)")
    assert "Traceback" not in result.output


def test_scale_rules_quote_the_spread_of_the_finite_values_never_nan():
    y = np.full((8, 1), 500.0, dtype=np.float32)
    y[::2] = -500.0
    y[0], y[1] = np.inf, np.nan  # clean-input-data's evidence, not a scale
    x = np.where(np.arange(3) == 0, np.inf, 200.0 * (np.arange(24).reshape(8, 3) % 2)).astype(np.float64)
    evidence = RunEvidence(keras_model=MODEL, features=feature_scales(x, ["a", "b", "c"]),
                           targets=target_scales([(None, "mse", y)]))
    report = report_of([record(s, 1.0) for s in range(3)])
    found = {rec.id: rec for rec in diagnose(report, evidence)}
    assert found["normalize-targets"].data["y_std"] == pytest.approx(500.0)
    assert "std 500" in found["normalize-targets"].evidence[0]
    assert "b (std 100)" in found["normalize-inputs"].evidence[0]  # feature a holds only Inf: no scale to quote
    evidence.targets = target_scales([(None, "mse", np.full((8, 1), np.nan, dtype=np.float32))])  # nothing finite
    assert "normalize-targets" not in [rec.id for rec in diagnose(report_of([record(0, 1.0)]), evidence)]


@pytest.mark.parametrize("steps", [1, 6, 600])  # 600: the chunked loop
def test_a_real_run_that_fits_perfectly_from_the_start_reports_healthy(steps, tmp_path):
    import json
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from nanscope.cli import app

    factories = Path(__file__).parent / "bad_inputs" / "factories.py"
    spec = {"model": {"factory": f"{factories}:zero_dense"}, "data": {"factory": f"{factories}:zeros", "batch_size": 8,
            "validation": {"fraction": 0.25}}, "train": {"loss": "mse", "optimizer": {"name": "adam"}, "steps": steps}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "r.json"
    argv = ["trace-steps", str(tmp_path / "spec.yaml"), "--json", str(out), "--trace", str(tmp_path / "t.jsonl")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["status"] == "healthy" and document["steps_run"] == steps
    assert {s["loss"] for s in document["steps"]} == {0.0}
    assert {s["grad_global_norm"] for s in document["steps"]} == {0.0}
    assert not [n for n in document["notes"] if "failed while the report was finished" in n], document["notes"]
