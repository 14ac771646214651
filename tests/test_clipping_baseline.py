"""compare-clipping recommends only strategies that learn: below the loss of a constant prediction.

Baselines are computed here with numpy from the same rows (the validation part is the
last fraction of the rows, as Keras' validation_split), and the initial weight norm from a
model built with plain Keras under the same seed.
"""

import json
import math
from pathlib import Path

import numpy as np
from rich.console import Console
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.run.clipping import compare_clipping
from nanscope.model.factory import load_callable
from nanscope.render.clipping_report import render_clipping_report
from nanscope.runtime import tensorflow
from nanscope.spec.load import parse_spec

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"
DATA = SPECS / "scaled_data.py"
IDS = SPECS / "id_models.py"


def regression(tmp_path, lr=0.01, steps=40, **args):
    doc = {
        "model": {"factory": f"{DATA}:mlp"},
        "data": {"factory": f"{DATA}:arrays", "args": args, "batch_size": 32, "validation": {"fraction": 0.25}},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": lr}, "steps": steps, "seed": 0},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(doc))
    return path


def test_strategies_that_stay_finite_without_learning_are_not_recommended(tmp_path):
    # Targets of mean 3e5 and std 1e5: the unclipped run diverges; clipped runs stay finite but
    # cannot move the output that far in 40 steps, so they end worse than predicting the mean.
    spec = regression(tmp_path, y_scale=1e5, y_shift=3e5)
    result = CliRunner().invoke(app, ["compare-clipping", str(spec), "--json", "-", "--strategies",
                                      "none,clipnorm,global_clipnorm,clipvalue"])
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)
    _, y = load_callable(f"{DATA}:arrays", DATA.parent, "test")(y_scale=1e5, y_shift=3e5)
    cut = len(y) - round(len(y) * 0.25)
    expected = float(np.mean((y[cut:].astype(np.float64) - y[:cut].mean()) ** 2))
    assert math.isclose(document["baseline"]["value"], expected, rel_tol=1e-4)
    finite = [s for s in document["strategies"] if s["first_nonfinite_step"] is None]
    assert finite and all(s["val_loss"] >= 0.99 * expected for s in finite)
    assert document["recommended"] is None and document["recommendations"] == []
    assert document["hides_problem"] is True
    assert "only hides the problem" in document["diagnosis"] and "trace-steps" in document["diagnosis"]
    assert "clipping only hides the problem" in result.stderr


def test_a_strategy_that_learns_is_recommended_and_says_it_beat_the_baseline(tmp_path):
    spec = regression(tmp_path, x_scale=1.0, y_scale=1.0, lr=0.05, steps=60)
    report = compare_clipping(parse_spec(json.loads(spec.read_text()), source=str(spec)), "none,global_clipnorm=1")
    assert report.recommended is not None and not report.hides_problem
    assert any("below the trivial baseline" in line for line in report.recommendations[0]["why"])


def test_the_cross_entropy_baseline_is_the_entropy_of_the_label_prior(tmp_path):
    doc = {
        "model": {"factory": f"{IDS}:classifier"},
        "data": {"factory": f"{IDS}:tokens", "batch_size": 32, "validation": {"fraction": 0.25}},
        "train": {"loss": {"name": "sparse_categorical_crossentropy", "from_logits": True},
                  "optimizer": {"name": "adam", "learning_rate": 0.001}, "steps": 2, "seed": 0},
    }
    report = compare_clipping(parse_spec(doc, source=str(tmp_path / "s.yaml")), "none")
    _, y = load_callable(f"{IDS}:tokens", IDS.parent, "test")()
    cut = len(y) - round(len(y) * 0.25)
    counts = np.bincount(y[:cut], minlength=2)
    prior = (counts + 1.0) / (counts.sum() + 2)  # Laplace-smoothed, as documented
    expected = float(-np.mean(np.log(prior[y[cut:]])))
    assert math.isclose(report.baseline.value, expected, rel_tol=1e-4)
    assert report.baseline.rows == "validation"


def test_derived_thresholds_use_the_weights_before_the_first_step(tmp_path):
    # lr 0.5 on targets of std 1e3: step 0 multiplies the weights' norm; the bound must come from before it.
    spec = regression(tmp_path, lr=0.5, y_scale=1e3)
    report = compare_clipping(parse_spec(json.loads(spec.read_text()), source=str(spec)), "none,global_clipnorm")
    keras.utils.set_random_seed(0)
    model = load_callable(f"{DATA}:mlp", DATA.parent, "test")()
    initial = math.sqrt(sum(float(np.sum(np.square(w.numpy().astype(np.float64)))) for w in model.trainable_weights))
    after_first = math.sqrt(sum(v.weight_norm ** 2 for v in report.runs[0].result.records[0].variables))
    assert after_first > 2 * initial  # the first step did move the weights far
    assert f"(norm {initial:.3g})" in report.thresholds["how"]


def test_an_interruption_before_any_strategy_finished_gives_no_verdict_on_clipping(tmp_path):
    spec = regression(tmp_path)

    def interrupt(name, done, total):
        raise KeyboardInterrupt

    report = compare_clipping(parse_spec(json.loads(spec.read_text()), source=str(spec)), "none,clipnorm=1",
                              on_progress=interrupt)
    assert report.interrupted and report.recommended is None and not report.hides_problem
    console = Console(record=True, width=120)
    render_clipping_report(report, console)
    text = console.export_text()
    assert "no clipping strategy fixes this run" not in text and "interrupted" in text
