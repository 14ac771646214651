"""The guard in `fit`: skip a non-finite step, roll back a diverging run, say whether a NaN reproduces and why."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import math

import numpy as np
import pytest

from nanscope.guard import GuardOptions
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
ROWS, BATCH, FEATURES = 128, 16, 8


def regression(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal((FEATURES, 1))).astype(np.float32)
    return x, y


def mlp(optimizer=None, layers=()):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                              *layers, keras.layers.Dense(1, name="out")])
    model.compile(optimizer=optimizer or keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class Logs(keras.callbacks.Callback):
    """The logs every batch hands the user's callbacks."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(dict(logs or {}))


def scope(**kwargs):
    return NanScope(verbose=0, **kwargs)


def test_skip_leaves_out_the_poisoned_batch_and_trains_as_the_run_without_it():
    x, y = regression()
    poisoned = x.copy()
    poisoned[3 * BATCH + 5, 2] = np.nan  # one row of batch 3 of every epoch
    clean = mlp()
    kept = np.r_[0:3 * BATCH, 4 * BATCH:ROWS]
    history_clean = clean.fit(x[kept], y[kept], batch_size=BATCH, epochs=3, shuffle=False, verbose=0)

    model, guard, logs = mlp(), scope(on_nonfinite="skip"), Logs()
    history = model.fit(poisoned, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[guard, logs])

    assert len(history.history["loss"]) == 3
    report = guard.report
    assert [(i["step"], i["action"]) for i in report.interventions] == [(3, "skip"), (11, "skip"), (19, "skip")]
    assert report.interventions[0]["reason"] == "non-finite data pass"
    # The same updates in the same order: the weights, the optimizer's counter and the epoch losses agree.
    for mine, theirs in zip(model.get_weights(), clean.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert int(model.optimizer.iterations.numpy()) == int(clean.optimizer.iterations.numpy()) == 21
    np.testing.assert_allclose(history.history["loss"], history_clean.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], history_clean.history["mae"], rtol=1e-5)
    skipped = [i for i, batch in enumerate(logs.batches) if batch.get("nanscope_skipped")]
    assert skipped == [3, 11, 19]
    assert all(math.isfinite(batch["loss"]) for batch in logs.batches)
    assert report.to_json()["interventions"][0] == {"step": 3, "action": "skip", "reason": "non-finite data pass",
                                                   "skips": 1, "consecutive": 1}


def test_skip_stops_the_run_past_max_skips_consecutive():
    x, y = regression()
    x[4 * BATCH:, 0] = np.nan  # every batch from batch 4 on
    model, guard = mlp(), scope(on_nonfinite="skip", max_skips=(2, 10))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[guard])
    actions = [(i["step"], i["action"]) for i in guard.report.interventions]
    assert actions == [(4, "skip"), (5, "skip"), (6, "stop")]
    assert guard.report.interventions[-1]["reason"] == "non-finite data pass; max_skips reached (2 consecutive)"
    assert guard.report.steps_run == 7


def test_rollback_keeps_a_diverging_run_finite():
    x, y = regression(rows=256)
    model, guard = mlp(keras.optimizers.SGD(0.5)), scope(on_nonfinite="rollback", snapshot_every=4)
    plain = mlp(keras.optimizers.SGD(0.5))
    plain.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0)
    assert not all(np.isfinite(w).all() for w in plain.get_weights())  # without the guard it diverges

    history = model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0, callbacks=[guard])

    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert len(history.history["loss"]) == 4 and math.isfinite(history.history["loss"][-1])
    assert history.history["loss"][-1] < history.history["loss"][1]  # it learns on after the rollback
    # The rollback applies the fix proven on the saved step's batch (the rules' first in-process one): clipping,
    # traced into the step from then on; the learning rate stays.
    (rollback,) = [i for i in guard.report.interventions if i["action"] == "rollback"]
    assert (rollback["step"], rollback["restored_step"]) == (5, 1)
    assert [t["fix"] for t in rollback["fixes_tried"]] == ["global_clipnorm=0.1"]
    assert rollback["fixes_tried"][0]["outcome"].startswith("finite, and its loss falls")
    assert rollback["fix"]["name"] == "global_clipnorm=0.1" and rollback["fix"]["rule"] == "clip-gradients"
    assert "learning_rate" not in rollback
    assert model.optimizer.global_clipnorm == 0.1 and float(model.optimizer.learning_rate.numpy()) == 0.5
    assert any("the rollback at step 5 applied global_clipnorm=0.1 (clip-gradients)" in n for n in guard.report.notes)
    first = guard.report.first_nonfinite
    # Re-run from the state before it, the step is non-finite again; from an earlier state, the batch is fine.
    assert (first.step, first.reproducible, first.origin) == (5, True, "state")
    assert guard.report.to_json()["first_nonfinite"]["origin"] == "state"

    # Without apply_fix the rollback lowers the learning rate instead.
    lowered = mlp(keras.optimizers.SGD(0.5))
    guard = scope(on_nonfinite="rollback", snapshot_every=4, guard=GuardOptions(apply_fix=False))
    lowered.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0, callbacks=[guard])
    assert all(np.isfinite(w).all() for w in lowered.get_weights())
    rollbacks = [i for i in guard.report.interventions if i["action"] == "rollback"]
    assert rollbacks[0]["learning_rate"] == [{"before": 0.5, "after": pytest.approx(0.05)}]
    assert "fixes_tried" not in rollbacks[0] and lowered.optimizer.global_clipnorm is None
    assert float(lowered.optimizer.learning_rate.numpy()) == pytest.approx(0.5 * 0.1 ** len(rollbacks))


FAULT = {"armed": False}


class FlakyOnce(keras.layers.Layer):
    """Returns NaN on the one call after the flag is armed (a transient fault), else its input."""

    def _fire(self):
        fired, FAULT["armed"] = FAULT["armed"], False
        return fired

    def call(self, x):
        fired = tf.py_function(self._fire, [], tf.bool)
        fired.set_shape([])
        return tf.where(fired, tf.fill(tf.shape(x), float("nan")), x)


class ArmAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            FAULT["armed"] = True


def test_a_transient_fault_does_not_reproduce():
    x, y = regression()
    model, guard = mlp(layers=[FlakyOnce(name="flaky")]), scope(snapshot_every=2)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[ArmAt(5), guard])
    first = guard.report.first_nonfinite
    assert (first.step, first.phase, first.layer) == (5, "forward", "flaky")
    assert (first.reproducible, first.origin) == (False, None)
    assert any(line.startswith("reproducible: no:") for line in guard.report.notes)


def test_a_planted_nan_row_reproduces_and_comes_from_the_batch():
    x, y = regression()
    x[6 * BATCH + 2, 4] = np.nan
    model, guard = mlp(), scope(snapshot_every=2)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[guard])
    first = guard.report.first_nonfinite
    assert (first.step, first.phase, first.reproducible, first.origin) == (6, "data", True, "batch")
    assert "origin: batch: from the state before step 3 the same batch is non-finite too (data pass)" in \
        " ".join(guard.report.notes)


def test_on_nonfinite_and_its_alias_are_validated():
    with pytest.raises(ValueError, match="`on_nonfinite` must be one of stop, continue, skip, rollback"):
        NanScope(on_nonfinite="retry")
    with pytest.raises(ValueError, match="alias"):
        NanScope(on_nonfinite="skip", stop_on_nonfinite=True)
    with pytest.raises(ValueError, match=r"`max_skips` must be an int >= 1 or a pair"):
        NanScope(on_nonfinite="skip", max_skips=(0, 3))
    assert NanScope(stop_on_nonfinite=False).options.guard.on_nonfinite == "continue"
    assert NanScope(guard=GuardOptions(on_nonfinite="skip")).options.stop_on_nonfinite is False


def custom_loop(x, y, learning_rate=0.05, **guard):
    import nanscope

    model = mlp()
    optimizer = keras.optimizers.SGD(learning_rate)
    loss_fn = keras.losses.MeanSquaredError()

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step = nanscope.instrument(model, optimizer, verbose=0, **guard)(tf.function(train_step)) if guard else \
        tf.function(train_step)
    for start in range(0, len(x), BATCH):
        step(tf.constant(x[start:start + BATCH]), tf.constant(y[start:start + BATCH]))
    return model, optimizer, step


def test_instrument_skips_a_poisoned_step_of_a_custom_loop():
    x, y = regression()
    poisoned = x.copy()
    poisoned[2 * BATCH, 0] = np.inf
    kept = np.r_[0:2 * BATCH, 3 * BATCH:ROWS]
    clean, clean_optimizer, _ = custom_loop(x[kept], y[kept])
    model, optimizer, step = custom_loop(poisoned, y, on_nonfinite="skip")
    report = step.nanscope.finish()
    assert [(i["step"], i["action"]) for i in report.interventions] == [(2, "skip")]
    for mine, theirs in zip(model.get_weights(), clean.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert int(optimizer.iterations.numpy()) == int(clean_optimizer.iterations.numpy()) == 7


def test_instrument_rollback_applies_the_fix_proven_on_the_saved_step_and_ends_finite():
    x, y = regression(rows=256)
    plain, _, _ = custom_loop(x, y, learning_rate=0.5)
    assert not all(np.isfinite(w).all() for w in plain.get_weights())  # without the guard it diverges
    model, optimizer, step = custom_loop(x, y, learning_rate=0.5, on_nonfinite="rollback", snapshot_every=4)
    report = step.nanscope.finish()
    assert all(np.isfinite(w).all() for w in model.get_weights())
    (rollback,) = [i for i in report.interventions if i["action"] == "rollback"]
    assert (rollback["step"], rollback["fix"]["name"]) == (5, "global_clipnorm=0.1")
    assert rollback["fixes_tried"][0]["outcome"].startswith("finite, and its loss falls")
    assert optimizer.global_clipnorm == 0.1 and float(optimizer.learning_rate.numpy()) == 0.5
    assert report.steps_run == 16 and math.isfinite(report.records[-1].loss)


def test_trace_steps_takes_on_nonfinite_and_refuses_what_it_cannot_do(tmp_path):
    import subprocess
    import sys

    spec = "configs/exploding-regression.yaml"
    run = [sys.executable, "-m", "nanscope", "trace-steps", spec, "--trace", str(tmp_path / "t.jsonl"),
           "--json", str(tmp_path / "r.json")]
    refused = subprocess.run([*run, "--on-nonfinite", "skip", "--keep-going"], capture_output=True, text=True)
    assert refused.returncode == 2
    assert "--on-nonfinite skip contradicts --keep-going: give one" in refused.stderr
    unknown = subprocess.run([*run, "--mode", "fast"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "--mode: must be full or sentinel, not 'fast'" in unknown.stderr
    kept = subprocess.run([*run, "--on-nonfinite", "continue", "--steps", "20"], capture_output=True, text=True)
    assert kept.returncode == 1
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps_run"] == 20 and report["first_nonfinite"]["step"] < 20


def test_by_default_no_earlier_state_is_kept_and_origin_says_so():
    x, y = regression()
    x[6 * BATCH, 1] = np.nan
    model, guard = mlp(), scope()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[guard])
    first = guard.report.first_nonfinite
    assert (first.step, first.reproducible, first.origin) == (6, True, None)
    assert "origin: not checked: no earlier state kept (snapshot_every=N keeps one every N steps)" in \
        guard.report.notes
    assert not any(note.startswith("guard: ") for note in guard.report.notes)
