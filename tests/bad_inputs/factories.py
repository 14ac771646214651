"""Factories for the bad-input corpus: tiny models and data, some deliberately wrong."""

import keras
import numpy as np
from keras import ops


def dense(features=4, outputs=1):
    """A tiny valid model: Dense(3, relu) -> Dense(outputs)."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(3, activation="relu", name="hidden"),
                             keras.layers.Dense(outputs, name="out")])


def frozen(features=4):
    """The tiny model with every layer frozen: no trainable variables."""
    model = dense(features)
    model.trainable = False
    return model


class OddModel(keras.Model):
    """A subclassed model whose call misbehaves in training: returns None, or raises."""

    def __init__(self, behaviour):
        super().__init__()
        self.behaviour = behaviour
        self.hidden = keras.layers.Dense(1)

    def call(self, x, training=False):
        out = self.hidden(x)
        if training and self.behaviour == "none":
            return None
        if training and self.behaviour == "raise":
            raise RuntimeError("the training branch is not written yet")  # raises: RuntimeError
        return out


def returns_nothing(features=4):
    return OddModel("none")


def raises_in_training(features=4):
    return OddModel("raise")


def arrays(rows=32, features=4, y_rows=None, labels=None, bad_row=None):
    """Valid (x, y) arrays; `y_rows` makes y a different length, `labels` gives integer class labels."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    if labels is not None:
        y = (np.arange(rows) % labels).astype(np.int64)
        if bad_row is not None:
            y[bad_row] = labels + 2
        return x, y
    y = x[:, :1] * 2.0
    return x, y[: y_rows if y_rows is not None else rows]


def empty(features=4):
    """No rows at all."""
    return np.zeros((0, features), np.float32), np.zeros((0, 1), np.float32)


def empty_dataset(features=4):
    """A tf.data.Dataset with no elements."""
    import tensorflow as tf

    x, y = empty(features)
    return tf.data.Dataset.from_tensor_slices((x, y))


def two_input_arrays(rows=16):
    """x as a list of two arrays of different widths."""
    return [np.zeros((rows, 3), np.float32), np.zeros((rows, 2), np.float32)], np.zeros((rows, 1), np.float32)


def ragged(rows=16):
    """Rows of different lengths: not one array."""
    return [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]] * (rows // 2), np.zeros((rows, 1), np.float32)


def with_sample_weights(rows=16, features=4):
    """(x, y, sample_weight), as model.fit takes them."""
    return np.zeros((rows, features), np.float32), np.zeros((rows, 1), np.float32), np.ones(rows, np.float32)


def images(rows=16):
    """Rows of 4x4 images for a model that expects 4 features."""
    return np.ones((rows, 4, 4), np.float32), np.zeros((rows, 1), np.float32)


def strings(rows=8):
    """x that is text, not numbers."""
    return np.array([["a", "b", "c", "d"]] * rows), np.zeros((rows, 1), np.float32)


def raises():
    """A factory that fails."""
    raise RuntimeError("the factory broke\non two lines")


def returns_int():
    """Not a model, not a dataset."""
    return 42


def with_lambda(features=4):
    """A model with a Lambda layer: saving it needs unsafe deserialization to load."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Lambda(lambda t: t * 2.0, name="double"),
                             keras.layers.Dense(1, name="out")])


class FailsAfter(keras.layers.Layer):
    """Raises InvalidArgumentError inside the compiled step once its counter passes `limit`."""

    def __init__(self, limit=3, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def build(self, input_shape):
        self.counter = self.add_weight(shape=(), initializer="zeros", trainable=False, name="counter")

    def call(self, x, training=False):
        import tensorflow as tf

        if training:
            self.counter.assign_add(1.0)
            tf.debugging.assert_less(self.counter, float(self.limit) + 0.5,
                                     message="FailsAfter: step limit passed")
        return x


def op_error(features=4, limit=3):
    """A model whose step raises tf.errors.InvalidArgumentError at step `limit`."""
    return keras.Sequential([keras.Input((features,)), FailsAfter(limit, name="guard"),
                             keras.layers.Dense(1, name="out")])


class PyFunc(keras.layers.Layer):
    """Runs Python inside the step: XLA cannot compile it; `error` makes it raise (MemoryError -> OOM)."""

    def __init__(self, error=None, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def call(self, x, training=False):
        import tensorflow as tf

        def body(t):
            if self.error == "memory" and training:
                raise MemoryError("pretend the device ran out of memory")
            return t

        out = tf.py_function(body, [x], x.dtype)
        out.set_shape(x.shape)
        return out


def python_in_step(features=4, error=None):
    """A model with a tf.py_function layer (no XLA kernel; optionally raising MemoryError)."""
    return keras.Sequential([keras.Input((features,)), PyFunc(error, name="pyfunc"), keras.layers.Dense(1, name="out")])


def uncompiled_classifier(features=4, classes=3):
    """Softmax over `classes` outputs."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(classes, activation="softmax", name="out")])


def negative_log(y_true, y_pred):
    """Unused helper so the module has more than one public function."""
    return ops.mean(-ops.log(y_pred))


def reads_config(features=4, config=None):
    """A factory that reads a setting its config does not have: KeyError, as a new user's first factory did."""
    config = config or {"units": 3}
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(config["unit"])])  # raises: KeyError


def endless_dataset(features=4, batched=True, unknown_length=False):
    """The tiny arrays as a tf.data.Dataset that never ends (`.repeat()`), batched or not; a filter hides its length."""
    import tensorflow as tf

    x, y = arrays(features=features)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = (dataset.batch(8) if batched else dataset).repeat()
    return dataset.filter(lambda x, y: True) if unknown_length else dataset


def zero_dense(features=4):
    """A linear model whose weights start at exactly 0: on all-zero data its loss and gradients are exactly 0."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(1, kernel_initializer="zeros", name="out")])


def zeros(rows=32, features=4):
    """Data the zero model fits perfectly from the first step: x and y all 0."""
    return np.zeros((rows, features), np.float32), np.zeros((rows, 1), np.float32)


def deep(features=4, depth=8):
    """`depth` small Dense layers: more layers and variables than a report's tables show by default."""
    layers = [keras.layers.Dense(3, activation="tanh", name=f"d{i}") for i in range(depth)]
    return keras.Sequential([keras.Input((features,)), *layers, keras.layers.Dense(1, name="out")])
