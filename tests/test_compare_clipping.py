"""compare-clipping end to end: the real CLI on real specs, numpy as the reference for Keras' clipping."""

import json
import os
import sys
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.run.clipping import Strategy
from nanscope.run.clipping.effect import clip_overrides
from nanscope.run.clipping.transforms import ClipMonitor, keras_clip
from nanscope.run.experiment import Change, run_experiment
from nanscope.run.session import open_session
from nanscope.spec.load import load_spec

REPO = Path(__file__).resolve().parent.parent
EXPLODING = REPO / "configs" / "exploding-regression.yaml"
SPECS = REPO / "tests" / "specs" / "clipping"
STEPS = 120


def run_cli(*args):
    """(exit code, parsed JSON from stdout or None, stderr)."""
    result = CliRunner().invoke(app, ["compare-clipping", *map(str, args)])
    stdout = result.stdout.strip()
    document = json.loads(stdout) if stdout.startswith("{") else None
    return result.exit_code, document, result.stderr


@pytest.fixture(scope="module")
def exploding():
    """The default comparison (none, clipvalue, clipnorm, global_clipnorm, auto) plus the manual modes."""
    return run_cli(
        EXPLODING, "--steps", STEPS, "--json", "-", "--strategies",
        "none,clipvalue,clipnorm,global_clipnorm,auto,manual_clip_by_norm=4,manual_clip_by_global_norm=8",
    )


def test_clipping_fixes_the_exploding_run_and_the_verdict_is_a_clipping_strategy(exploding):
    code, doc, stderr = exploding
    assert code == 0, stderr
    by_name = {s["name"]: s for s in doc["strategies"]}
    assert by_name["none"]["first_nonfinite_step"] is not None
    assert by_name["none"]["first_nonfinite_step"] < STEPS
    clipped = [s for s in doc["strategies"] if s["name"] != "none" and not s["name"].startswith("auto")]
    assert clipped and all(s["first_nonfinite_step"] is None for s in clipped)
    assert all(s["steps_run"] == STEPS and np.isfinite(s["val_loss"]) for s in clipped)
    assert doc["recommended"] in {s["name"] for s in clipped}
    assert doc["recommendations"][0]["name"] == doc["recommended"]
    best = min((s for s in doc["strategies"] if s["first_nonfinite_step"] is None), key=lambda s: s["val_loss"])
    assert best["name"] == doc["recommended"]
    # The run-spec fix names the optimizer option that applies the recommended strategy, at its threshold.
    params = by_name[doc["recommended"]]["params"]
    option = {"manual_clip_by_norm": "clipnorm", "manual_clip_by_global_norm": "global_clipnorm",
              "auto": "global_clipnorm"}.get(params["mode"], params["mode"])
    assert doc["recommendations"][0]["yaml"] == f"train:\n  optimizer: {{{option}: {params['threshold']:g}}}"


def test_every_strategy_starts_from_the_same_weights_and_sees_the_same_batches(exploding):
    _, doc, _ = exploding
    strategies = doc["strategies"]
    assert len({s["start_fingerprint"] for s in strategies}) == 1
    full = [s for s in strategies if s["steps_run"] == STEPS]
    assert len(full) >= 5
    assert len({s["batches_fingerprint"] for s in full}) == 1
    # The first loss is computed before any update: same weights and same first batch give the same value.
    assert len({round(s["losses"][0], 3) for s in strategies}) == 1


def test_json_shape_and_measured_clipping(exploding):
    _, doc, _ = exploding
    assert doc["schema"] == "nanscope.clipping/1"
    assert {"strategies", "recommended", "recommendations", "thresholds"} <= set(doc)
    for s in doc["strategies"]:
        assert {"name", "params", "first_nonfinite_step", "final_loss", "best_loss", "val_loss", "clipped_fraction",
                "losses", "clip_effect"} <= set(s)
        assert len(s["losses"]) == s["steps_run"]
        if s["name"] == "none":
            continue
        assert s["params"]["threshold"] > 0 and s["params"]["threshold_source"]
        if s["first_nonfinite_step"] is None:
            assert 0.0 < s["clipped_fraction"] <= 1.0
            assert s["clip_effect"]["took_effect"] is True
            assert s["clip_effect"]["steps_within_threshold"] == s["clip_effect"]["steps_bit"] > 0
        if s["params"]["mode"] in ("clipvalue", "clipnorm", "global_clipnorm"):
            assert s["clip_effect"]["optimizer_check"]["verified"] is True
    # Thresholds left open were derived from the unclipped run, and the report says how.
    assert doc["thresholds"]["healthy_steps"] > 0 and "percentile" in doc["thresholds"]["how"]
    auto = next(s for s in doc["strategies"] if s["name"] == "auto")
    assert "AutoClip" in auto["params"]["threshold_source"]


def _numpy_clip(grads, mode, c):
    if mode in ("clipnorm", "manual_clip_by_norm"):
        return [g * c / max(np.linalg.norm(g), c) for g in grads]
    if mode in ("global_clipnorm", "manual_clip_by_global_norm"):
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
        return [g * min(1.0, c / norm) for g in grads]
    return [np.clip(g, -c, c) for g in grads]


def _one_step(session, change):
    run_experiment(session, change, steps=1)
    return [v.numpy() - w for v, w in zip(session.model.trainable_variables, session.initial_weights)]


@pytest.mark.parametrize("mode, threshold", [
    ("clipvalue", 0.5), ("clipnorm", 1.0), ("global_clipnorm", 1.0),
    ("manual_clip_by_norm", 1.0), ("manual_clip_by_global_norm", 1.0),
])
def test_one_step_matches_numpy_keras_semantics(mode, threshold):
    session = open_session(load_spec(SPECS / "sgd-plain.yaml"))
    lr = session.spec.train.optimizer.learning_rate
    assert session.model.trainable_variables[0] is session.model.keras_model.trainable_variables[0]
    raw_grads = [-dw / lr for dw in _one_step(session, Change("none", optimizer_overrides=clip_overrides()))]
    strategy = Strategy(mode, threshold)
    keras_mode = mode if strategy.is_keras_option else None
    change = Change(mode, optimizer_overrides=clip_overrides(keras_mode, threshold),
                    grad_transform=ClipMonitor(strategy, 1))
    dw = _one_step(session, change)
    expected = [-lr * g for g in _numpy_clip(raw_grads, mode, threshold)]
    assert any(not np.allclose(e, -lr * g) for e, g in zip(expected, raw_grads)), "the threshold must bite"
    for got, want in zip(dw, expected):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-6)


def test_global_clipnorm_of_a_nonfinite_gradient_is_nan_everywhere():
    import tensorflow as tf

    grads = [tf.constant([1.0, np.inf]), tf.constant([2.0, 3.0])]
    assert all(np.isnan(g.numpy()).all() for g in keras_clip(grads, "global_clipnorm", 1.0))
    assert np.isfinite(keras_clip(grads, "clipvalue", 1.0)[1].numpy()).all()


def test_a_forward_pass_nan_is_not_fixed_by_clipping_and_exits_1():
    code, doc, stderr = run_cli(SPECS / "log-of-zero.yaml", "--steps", 5, "--json", "-")
    assert code == 1, stderr
    assert doc["recommended"] is None and doc["recommendations"] == []
    assert all(s["first_nonfinite_step"] == 0 and s["first_nonfinite_phase"] == "forward" for s in doc["strategies"])
    assert "forward" in doc["diagnosis"] and "trace-steps" in doc["diagnosis"]
    assert "no clipping strategy fixes this run" in stderr


@pytest.mark.parametrize("strategies, message", [
    ("clipnrom=1", "`--strategies`: unknown strategy 'clipnrom=1'; did you mean `clipnorm`?"),
    ("none,clipnorm=0", "`clipnorm` must be > 0. Received: clipnorm=0"),
    ("global_clipnorm=-1", "`global_clipnorm` must be > 0"),
    ("clipvalue=abc", "threshold of clipvalue must be a number"),
    ("auto=5", "auto takes no threshold"),
    ("none,,auto", "empty entry"),
])
def test_bad_strategies_exit_2_with_one_line(strategies, message):
    code, doc, stderr = run_cli(EXPLODING, "--strategies", strategies)
    assert code == 2 and doc is None
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_plot_without_matplotlib_exits_2(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    code, _, stderr = run_cli(EXPLODING, "--plot", "curves.png")
    assert code == 2 and "nanscope[plot]" in stderr


def test_plot_writes_the_loss_curves_and_the_json_still(tmp_path):
    pytest.importorskip("matplotlib")
    image, out = tmp_path / "curves.png", tmp_path / "r.json"
    code, _, stderr = run_cli(EXPLODING, "--steps", 20, "--strategies", "none,clipnorm=1", "--plot", image,
                              "--json", out)
    assert code == 0, stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000
    assert [s["name"] for s in json.loads(out.read_text())["strategies"]] == ["none", "clipnorm=1"]


def test_a_long_experiment_keeps_a_bounded_set_of_full_rows():
    """A run's result holds every step's scalars in float32 columns and full rows for a bounded set of steps."""
    from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE

    session = open_session(load_spec(REPO / "tests" / "specs" / "healthy.yaml"))
    results = {steps: run_experiment(session, Change("none"), steps=steps) for steps in (1_200, 4_000)}
    bound = 2 * DEFAULT_KEEP + DEFAULT_SAMPLE + 1
    for steps, result in results.items():
        assert result.steps_run == steps and len(result.losses) == len(result.grad_global_norms) == steps
        assert len(result.records) <= bound and result.final_loss == result.losses[-1]
        assert result.history.series.nbytes <= 2 * 32 * steps  # six float32 columns and the step: 32 bytes a step
    short, long = results[1_200], results[4_000]
    assert len(short.records) < short.steps_run and len(long.records) <= bound < long.steps_run // 2
    assert long.first_healthy.step == 0 and long.best_loss == min(long.losses)


def test_auto_with_one_healthy_step_clips_at_the_global_bound_and_says_so(tmp_path):
    """The unclipped IRNN's step 0 is healthy (norm ~5e3) and step 1 overflows: one norm is no 10th percentile.
    Before, auto clipped at that norm, never bit, and went non-finite at step 1 too."""
    import io

    from rich.console import Console

    from nanscope.run.clipping import compare_clipping
    from nanscope.run.clipping.result import clipping_json
    from nanscope.render.clipping_report import render_clipping_report

    report = compare_clipping(load_spec(SPECS / "irnn.yaml"), "none,auto,global_clipnorm", steps=4)
    runs = {run.strategy.kind: run for run in report.runs}
    unclipped = runs["none"].result
    assert unclipped.first_nonfinite_step == 1 and len(unclipped.healthy_grad_norms()) == 1
    assert unclipped.healthy_grad_norms()[0] > 1000
    auto = runs["auto"]
    assert report.thresholds["auto_from"] == "global_norm_bound" and report.thresholds["healthy_steps"] == 1
    assert auto.strategy.threshold == runs["global_clipnorm"].strategy.threshold == report.thresholds[
        "global_norm_bound"] == 4
    assert auto.result.finite and auto.effect.clipped_fraction == 1.0 and auto.took_effect is True
    assert auto.strategy.threshold_source.startswith(
        "AutoClip's 10th percentile needs at least 10 healthy steps and the unclipped run had 1, so auto uses G = 4")
    doc = json.loads(json.dumps(clipping_json(report)))
    assert doc["thresholds"]["auto_min_healthy_steps"] == 10
    assert next(s for s in doc["strategies"] if s["name"] == "auto")["params"]["threshold"] == 4
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    render_clipping_report(report, console)
    text = console.export_text()
    assert "4 (G)" in text and "auto (G): AutoClip's percentile needs at least 10 healthy steps" in text
