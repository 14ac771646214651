"""Multi-output models and their data, for per-output loss tests.

Every model has a shared trunk and two heads: `price` (regression, 1 unit) and
`kind` (3-class logits).
"""

import numpy as np

from nanscope.runtime import tensorflow

_, keras = tensorflow()
FEATURES, CLASSES = 6, 3


def _trunk():
    inputs = keras.Input((FEATURES,), name="features")
    return inputs, keras.layers.Dense(16, activation="tanh", name="trunk")(inputs)


def two_heads():
    """A functional model with a list of outputs [price, kind]."""
    inputs, hidden = _trunk()
    price = keras.layers.Dense(1, name="price")(hidden)
    kind = keras.layers.Dense(CLASSES, name="kind")(hidden)
    return keras.Model(inputs, [price, kind], name="two_heads")


def dict_heads():
    """The same heads, returned as a dict {"kind": ..., "price": ...}."""
    inputs, hidden = _trunk()
    outputs = {"price": keras.layers.Dense(1, name="price")(hidden),
               "kind": keras.layers.Dense(CLASSES, name="kind")(hidden)}
    return keras.Model(inputs, outputs, name="dict_heads")


def dead_kind_head():
    """`kind` ends in a ReLU that is exactly 0 everywhere: a naive cross-entropy on it takes log(0)."""
    inputs, hidden = _trunk()
    price = keras.layers.Dense(1, name="price")(hidden)
    kind = keras.layers.Dense(CLASSES, activation="relu", bias_initializer=keras.initializers.Constant(-100.0),
                              name="kind")(hidden)
    return keras.Model(inputs, [price, kind], name="dead_kind_head")


def compiled_heads():
    """two_heads, compiled with one loss per output and loss weights."""
    model = two_heads()
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss={"price": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  loss_weights={"price": 0.5, "kind": 2.0})
    return model


def naive_crossentropy(y_true, y_pred):
    """-log of the predicted probability of the true class, without any epsilon: log(0) = -inf."""
    tf, _ = tensorflow()
    picked = tf.gather(y_pred, tf.cast(tf.reshape(y_true, [-1]), tf.int32), batch_dims=1)
    return -tf.math.log(picked)


def arrays(rows=64, seed=0, nan_price_row=None):
    """x and a mapping {price: (rows, 1) float32, kind: (rows,) int32 in [0, 3)}."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    price = (x[:, :1] * 2.0 + 0.1 * rng.standard_normal((rows, 1))).astype(np.float32)
    kind = rng.integers(0, CLASSES, rows).astype(np.int32)
    if nan_price_row is not None:
        price[nan_price_row, 0] = np.nan
    return x, {"price": price, "kind": kind}


def arrays_list(rows=64, seed=0):
    """The same data with the targets as a list in output order [price, kind]."""
    x, y = arrays(rows, seed)
    return x, [y["price"], y["kind"]]


def dataset(rows=64, seed=0):
    """The same data as a batched tf.data.Dataset of (x, {price, kind})."""
    tf, _ = tensorflow()
    x, y = arrays(rows, seed)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def single_target(rows=64, seed=0):
    """One target array only: wrong for a two-output model."""
    x, y = arrays(rows, seed)
    return x, y["price"]


def two_heads_two_classes():
    """two_heads with a 2-unit `kind` head: the labels in [0, 3) do not fit it."""
    inputs, hidden = _trunk()
    price, kind = keras.layers.Dense(1, name="price")(hidden), keras.layers.Dense(2, name="kind")(hidden)
    return keras.Model(inputs, [price, kind])
