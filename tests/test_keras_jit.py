"""NanScope under jit_compile=True: the snapshot is taken outside XLA and the failing step is replayed without it."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
ROWS, BATCH = 64, 16

MASKED_LOSS = """import tensorflow as tf


def masked_mse(y, p):
    mask = tf.cast(y > 0, tf.float32)
    err = tf.square(p - y) * mask
    return tf.reduce_sum(err) / tf.reduce_sum(mask)  # a batch without a positive target: 0/0
"""


def data(zero_step=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    y = (np.abs(x @ rng.standard_normal((8, 1))) + 0.1).astype(np.float32)
    if zero_step is not None:
        y[zero_step * BATCH:(zero_step + 1) * BATCH] = 0.0
    return x, y


class UnitNorm(keras.layers.Layer):
    """Divides each row by its norm: a zero row is 0/0."""

    def call(self, x):
        return x / tf.norm(x, axis=-1, keepdims=True)


def fit(model, x, y, callbacks, epochs=1):
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)


def test_a_zero_mask_batch_in_the_loss_is_named_with_its_line(tmp_path, monkeypatch):
    (tmp_path / "jit_losses.py").write_text(MASKED_LOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from jit_losses import masked_mse

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss=masked_mse, jit_compile=True, steps_per_execution=2)
    x, y = data(zero_step=1)  # the second step of the first execution
    scope = NanScope(verbose=0)
    fit(model, x, y, [scope])
    report = scope.report
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op, first.layer) == (1, "loss", "RealDiv", None)
    assert first.source.endswith("jit_losses.py:7")
    # Said once, in the words the replay uses (it was said twice, once as "part of the loss the loss")
    assert [line for line in first.detail if "outside any layer" in line] == [
        "RealDiv is part of the loss, outside any layer"]
    assert report.recommendations[0].id == "safe-division"
    assert report.run["jit_compile"] is True
    assert any(note.startswith("forensics: the weights and optimizer state") for note in report.notes)
    assert model.jit_compile is True and "train_step" not in model.__dict__


def test_a_layer_dividing_by_a_zero_norm_is_named():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, use_bias=False, name="a"),
                              UnitNorm(name="unit_norm"), keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x, y = data()
    x[2 * BATCH + 3] = 0.0  # step 2: a zero row, whose projection without a bias has norm 0
    scope = NanScope(verbose=0)
    fit(model, x, y, [scope])
    first = scope.report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (2, "forward", "unit_norm", "RealDiv")
    assert first.source.endswith(f"test_keras_jit.py:{UnitNorm.call.__code__.co_firstlineno + 1}")
    assert "safe-division" in [r.id for r in scope.report.recommendations]


def test_the_losses_under_xla_are_the_same_with_and_without_nanscope():
    # Dropout's masks under XLA differ from those without it: the user's step stays compiled by XLA.
    x, y = data()
    losses = []
    for callbacks in ([], [NanScope(verbose=0)]):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.BatchNormalization(), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", jit_compile=True)
        losses.append(fit(model, x, y, callbacks, epochs=3).history["loss"])
    assert losses[0] == losses[1]
