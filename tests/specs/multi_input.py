"""Models with two inputs ("tokens" 3 wide, "numbers" 2 wide) and their data, as a mapping, a list or tf.data."""

import keras
import numpy as np

ROWS = 64


def by_name():
    """A functional model whose inputs are a mapping from input name."""
    tokens, numbers = keras.Input((3,), name="tokens"), keras.Input((2,), name="numbers")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(keras.layers.Concatenate()([tokens, numbers]))
    return keras.Model({"tokens": tokens, "numbers": numbers}, keras.layers.Dense(1, name="out")(hidden))


def in_order():
    """The same model taking a list of inputs, in order."""
    tokens, numbers = keras.Input((3,), name="tokens"), keras.Input((2,), name="numbers")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(keras.layers.Concatenate()([tokens, numbers]))
    return keras.Model([tokens, numbers], keras.layers.Dense(1, name="out")(hidden))


def arrays(form="mapping", nan_row=None, scale=1.0, numbers_rows=ROWS):
    """(x, y) with x a mapping (`form`: "mapping"), a list ("list") or a tf.data.Dataset of either ("dataset")."""
    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((ROWS, 3)).astype(np.float32) * scale
    numbers = rng.standard_normal((numbers_rows, 2)).astype(np.float32)
    if nan_row is not None:
        numbers[nan_row, 1] = np.nan
    y = (tokens[:, :1] / scale + rng.standard_normal((ROWS, 1))).astype(np.float32)
    if form == "list":
        return [tokens, numbers], y
    x = {"tokens": tokens, "numbers": numbers}
    if form == "dataset":
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    return x, y
