"""Models and data with id inputs (token ids, category ids) and with measurements, for the scale rules."""

import numpy as np

from nanscope.runtime import tensorflow

tf, keras = tensorflow()
VOCAB, LENGTH = 500, 10


def tokens(rows=256, dtype="int32", seed=0, nan_row=None, target_mean=None, target_std=1.0):
    """Token ids in [1, VOCAB) (far from unit scale as numbers) and a label; optional regression targets."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(rows, LENGTH)).astype(dtype)
    if target_mean is not None:
        y = (target_mean + target_std * rng.standard_normal((rows, 1))).astype(np.float32)
        if nan_row is not None:
            y[nan_row] = np.nan
        return x, y
    return x, (x[:, 0] % 2).astype(np.int32)


def tokens_and_prices(rows=256, seed=0):
    """A mapping of inputs: int32 token ids and a float price column of std ~1000; a regression target."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(rows, LENGTH)).astype(np.int32)
    price = rng.normal(5000.0, 1000.0, size=(rows, 1)).astype(np.float32)
    return {"tokens": ids, "price": price}, rng.standard_normal((rows, 1)).astype(np.float32)


def classifier(outputs=2, log_of_softmax=False, dtype="int32"):
    """Embedding -> mean -> Dense; with `log_of_softmax` a softmax head whose log the loss takes (NaN when a
    probability underflows to 0)."""
    inputs = keras.Input((LENGTH,), dtype=dtype)
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 8)(inputs))
    out = keras.layers.Dense(outputs, activation="softmax" if log_of_softmax else None)(h)
    return keras.Model(inputs, out)


def embedding_regressor():
    """Token ids -> Embedding -> Dense(1), a regression head."""
    inputs = keras.Input((LENGTH,))
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 8)(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def tokens_and_price_model():
    """Two inputs by name: token ids through an Embedding, a price through Dense."""
    ids = keras.Input((LENGTH,), name="tokens")
    price = keras.Input((1,), name="price")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 4)(ids))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([h, keras.layers.Dense(4)(price)]))
    return keras.Model({"tokens": ids, "price": price}, out)


def log_softmax_loss(y_true, y_pred):
    """-log p of the true class, taken of a softmax output: -inf once p underflows to 0."""
    labels = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    picked = tf.gather(y_pred, labels, axis=1, batch_dims=1)
    return -tf.math.log(picked) * 1000.0
