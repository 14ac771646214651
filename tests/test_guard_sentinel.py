"""mode="sentinel": every step's scalars, the full rows sampled, the first NaN localized as in full mode."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

from nanscope.guard import GuardOptions
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
ROWS, BATCH = 256, 8


def data(negative_at=None):
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((ROWS, 6))).astype(np.float32) + 0.1
    y = (np.log(x) @ rng.standard_normal((6, 1))).astype(np.float32)
    if negative_at is not None:
        x[negative_at * BATCH + 1, 3] = -1.0  # log of it: NaN in the forward pass, in layer "log"
    return x, y


def model(jit_compile=False):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Lambda(tf.math.log, name="log"),
                          keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dense(1, name="out")])
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=jit_compile)
    return m


def fit(mode, x, y, jit_compile=False, **kwargs):
    m, scope = model(jit_compile), NanScope(verbose=0, mode=mode, **kwargs)
    m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    return m, scope.report


def test_sentinel_records_every_step_and_trains_as_full_mode():
    x, y = data()
    full_model, full = fit("full", x, y)
    model_s, sentinel = fit("sentinel", x, y, guard=GuardOptions(sample_every=10))
    assert sentinel.steps_run == full.steps_run == ROWS // BATCH
    np.testing.assert_allclose([r.loss for r in sentinel.records], [r.loss for r in full.records], rtol=1e-6)
    # Layer rows only on the sampled executions (every 10th, the first included).
    assert [r.step for r in sentinel.records if r.layers] == [0, 10, 20, 30]
    assert_norms_as_full_mode(sentinel, full)
    for mine, theirs in zip(model_s.get_weights(), full_model.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert any(note.startswith("mode=sentinel: full statistics on every 10th execution") for note in sentinel.notes)


def assert_norms_as_full_mode(sentinel, full):
    """The light steps measure |w| and |dw|/|w| over all weights: every step's, as full mode's per-variable rows."""
    for column in ("weight_norm", "update_ratio"):
        np.testing.assert_allclose(sentinel.history.column(column), full.history.column(column), rtol=1e-5)
    assert sentinel.history.column("update_ratio").min() > 0


def test_sentinel_localizes_the_first_nan_as_full_mode_does():
    x, y = data(negative_at=13)
    _, full = fit("full", x, y)
    _, sentinel = fit("sentinel", x, y, guard=GuardOptions(sample_every=10))
    f, s = full.first_nonfinite, sentinel.first_nonfinite
    assert (s.step, s.phase, s.layer, s.op) == (f.step, f.phase, f.layer, f.op) == (13, "forward", "log", "Log")
    assert s.source == f.source and s.reproducible is True
    assert sentinel.records[-1].step == 13 and sentinel.records[-1].layers  # the failing step's full row
    assert sentinel.steps_run == 14


def test_sentinel_under_jit_compile_samples_the_full_step_and_localizes_the_first_nan():
    # XLA compiles the light step and the full step each on its own; the state copy is taken outside XLA.
    x, y = data(negative_at=6)
    _, sentinel = fit("sentinel", x, y, jit_compile=True, guard=GuardOptions(sample_every=4))
    assert [r.step for r in sentinel.records if r.layers] == [0, 4, 6]
    s = sentinel.first_nonfinite
    assert (s.step, s.phase, s.layer, s.op, s.reproducible) == (6, "forward", "log", "Log", True)


def test_mode_is_validated():
    with pytest.raises(ValueError, match=r"`mode` must be one of full, sentinel\. Received: mode='fast'"):
        NanScope(mode="fast")


def custom_loop(mode, x, y, **kwargs):
    """A custom loop under `nanscope.instrument(mode=...)`: the model, its step (whose `.nanscope.report` is kept)."""
    import nanscope

    m = model()
    optimizer, loss_fn = keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError()

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, m(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss

    step = nanscope.instrument(m, optimizer, verbose=0, mode=mode, **kwargs)(tf.function(train_step))
    try:
        for start in range(0, ROWS, BATCH):
            step(tf.constant(x[start:start + BATCH]), tf.constant(y[start:start + BATCH]))
    except nanscope.NonFiniteError:
        pass
    return m, step.nanscope.finish()


def test_instrument_sentinel_trains_as_full_mode_and_localizes_the_first_nan_as_it():
    x, y = data()
    full_model, full = custom_loop("full", x, y)
    model_s, sentinel = custom_loop("sentinel", x, y, guard=GuardOptions(sample_every=10))
    assert sentinel.steps_run == full.steps_run == ROWS // BATCH
    np.testing.assert_allclose([r.loss for r in sentinel.records], [r.loss for r in full.records], rtol=1e-6)
    np.testing.assert_allclose([r.grad_global_norm for r in sentinel.records],
                               [r.grad_global_norm for r in full.records], rtol=1e-5)
    assert [r.step for r in sentinel.records if r.layers] == [0, 10, 20, 30]
    assert_norms_as_full_mode(sentinel, full)
    for mine, theirs in zip(model_s.get_weights(), full_model.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert any(note.startswith("mode=sentinel: full statistics on every 10th call") for note in sentinel.notes)

    # Step 13 is a light one: re-run in full and replayed, it is named as full mode names it in `fit` (above).
    x, y = data(negative_at=13)
    _, sentinel = custom_loop("sentinel", x, y, guard=GuardOptions(sample_every=10))
    s = sentinel.first_nonfinite
    assert (s.step, s.phase, s.layer, s.op, s.reproducible) == (13, "forward", "log", "Log", True)
    assert sentinel.steps_run == 14 and sentinel.records[-1].layers
