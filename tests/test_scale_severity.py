"""Severity of the scale rules: at most warnings, unless a large spread alone predicts the divergence.

Target moments come from numpy on the same arrays the run trains on.
"""

from pathlib import Path

import numpy as np

from nanscope.model.factory import load_callable
from nanscope.rules.diagnose import EXTREME_SCALE, SCALE_LIMIT
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

MODELS = Path(__file__).parent / "specs" / "id_models.py"
tokens = load_callable(f"{MODELS}:tokens", MODELS.parent, "test")


def trace(tmp_path, lr, **data_args):
    doc = {
        "model": {"factory": f"{MODELS}:embedding_regressor"},
        "data": {"factory": f"{MODELS}:tokens", "args": data_args, "batch_size": 32, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": lr}, "steps": 30, "seed": 0},
    }
    return run_trace(parse_spec(doc, source=str(tmp_path / "spec.yaml")), TraceOptions(trace_path=tmp_path / "t.jsonl"))


def by_id(report):
    return {r.id: (i, r) for i, r in enumerate(report.recommendations)}


def test_a_nan_row_ranks_above_the_target_scale_which_stays_a_warning(tmp_path):
    _, y = tokens(target_mean=0.0, target_std=5000.0, nan_row=3)
    assert np.nanstd(y) > EXTREME_SCALE
    report = trace(tmp_path, 1e-9, target_mean=0.0, target_std=5000.0, nan_row=3)
    assert report.first_nonfinite.phase == "data"
    found = by_id(report)
    assert report.recommendations[0].id == "clean-input-data"
    assert found["normalize-targets"][1].severity == "warning"


def test_an_offset_target_is_at_most_a_warning_in_a_diverging_run(tmp_path):
    _, y = tokens(target_mean=10.5, target_std=0.3)
    assert np.abs(y).mean() > SCALE_LIMIT and y.std() < 1.0
    report = trace(tmp_path, 5.0, target_mean=10.5, target_std=0.3)
    assert report.first_nonfinite is not None and report.first_nonfinite.phase != "data"
    assert by_id(report)["normalize-targets"][1].severity == "warning"


def test_a_large_spread_in_a_diverging_run_is_an_error(tmp_path):
    report = trace(tmp_path, 0.05, target_mean=0.0, target_std=5000.0)
    assert report.first_nonfinite is not None and report.first_nonfinite.phase != "data"
    assert by_id(report)["normalize-targets"][1].severity == "error"


def test_a_large_spread_in_a_finite_run_is_info(tmp_path):
    report = trace(tmp_path, 1e-9, target_mean=0.0, target_std=5000.0)
    assert report.first_nonfinite is None
    assert by_id(report)["normalize-targets"][1].severity == "info"
