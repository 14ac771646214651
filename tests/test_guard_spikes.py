"""The guard's spike detector: a robust z-score of the loss and the gradient norm, quiet on a healthy noisy run."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import math

import numpy as np
import pytest

from nanscope.engine.records import StepRecord
from nanscope.guard import GuardOptions
from nanscope.guard.spikes import SpikeDetector, robust_z
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()


def record(step, loss, grad_norm=1.0):
    return StepRecord(step=step, batch_rows=8, loss=loss, data_loss=loss, grad_global_norm=grad_norm,
                      applied_grad_global_norm=grad_norm, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                      loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0)


def test_robust_z_is_a_log_ratio_against_the_median_absolute_deviation():
    history = np.exp(np.array([-1.0, 0.0, 1.0, 0.0, -1.0, 1.0, 0.0, 0.0]))  # log: median 0, MAD 0.5
    assert abs(robust_z(math.exp(1.4826 * 0.5 * 6), history) - 6.0) < 1e-9
    assert robust_z(1.0, history) == 0.0
    # A flat window: the spread's floor (0.01 on the log scale) keeps rounding from scoring.
    assert abs(robust_z(1.0 * math.exp(0.06), np.ones(8)) - 6.0) < 1e-9
    # Negative values (a log-likelihood): the raw values, with a floor of 1% of |median|.
    assert abs(robust_z(-0.94, -np.ones(8)) - 6.0) < 1e-9


def test_the_detector_waits_for_a_full_window_and_leaves_spikes_out_of_it():
    detector = SpikeDetector(sigma=6.0, window=16)
    rng = np.random.default_rng(0)
    losses = 1.0 + 0.05 * rng.standard_normal(16)
    assert all(detector.score(record(i, float(v))) is None for i, v in enumerate(losses))
    metric, value, median, z = detector.score(record(16, 50.0))
    assert (metric, value) == ("loss", 50.0) and z > 6.0
    assert median == pytest.approx(float(np.median(losses)))
    assert detector.score(record(17, 50.0))[0] == "loss"  # the spike did not join the window
    assert detector.score(record(18, float(np.median(losses)))) is None


def test_a_healthy_run_with_noisy_minibatch_losses_stays_quiet():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1024, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1)) + rng.standard_normal((1024, 1))).astype(np.float32)  # noise: sd 1
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    guard = NanScope(verbose=0, skip_spikes=True)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=True, verbose=0, callbacks=[guard])  # 256 steps
    losses = [r.loss for r in guard.report.records]
    assert max(losses) > 8 * float(np.median(losses))  # the minibatch losses are noisy indeed
    assert guard.report.spikes == [] and guard.report.interventions == []


def test_a_spike_names_its_rows_and_the_variables_whose_updates_jumped_and_skip_spikes_undoes_it():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1))).astype(np.float32)
    y[40 * 8 + 3] *= 300.0  # two rows of batch 40 with wild targets
    y[40 * 8 + 6] *= -200.0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    guard = NanScope(verbose=0, skip_spikes=True, guard=GuardOptions(spike_window=32))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[guard])
    report = guard.report
    spike = report.spikes[0]
    assert (spike["step"], spike["skipped"]) == (40, True)
    assert spike["metric"] in ("loss", "grad_global_norm") and spike["z"] > 6.0
    assert {row["row"] for row in spike["rows"][:2]} == {3, 6}  # the two wild rows, the largest loss first
    assert spike["rows"][0]["loss"] >= spike["rows"][1]["loss"] > 100 * spike["rows"][2]["loss"]
    assert {entry["variable"] for entry in spike["layers"]} & {"hidden/kernel", "out/kernel"}
    assert report.interventions[0]["step"] == 40 and report.interventions[0]["action"] == "skip"
    assert report.interventions[0]["reason"].startswith(f"{spike['metric']} spike: z=")
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_the_cached_limit_agrees_with_the_exact_score():
    from nanscope.guard.spikes import limit

    rng = np.random.default_rng(3)
    for history in (np.exp(rng.standard_normal(64)), -np.exp(rng.standard_normal(64))):
        edge = limit(6.0, history)
        assert robust_z(edge * (1 + 1e-6) if edge > 0 else edge * (1 - 1e-6), history) > 6.0
        assert robust_z(edge - abs(edge) * 1e-6, history) < 6.0
