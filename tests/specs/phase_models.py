"""Purpose-built tiny models, one per phase a first non-finite value can appear in."""

import keras
from keras import ops


class LogOfInput(keras.layers.Layer):
    """Forward-pass producer: log of its input, NaN for negative inputs."""

    def call(self, x):
        return ops.log(x)


class SqrtOfRelu(keras.layers.Layer):
    """Backward-pass producer: sqrt(relu(x)) is finite at 0 but its gradient there is infinite."""

    def call(self, x):
        return ops.sqrt(ops.relu(x))


def dense(features=4):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(3, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out")])


def forward_nan(features=4):
    """Dense -> log: log of negative pre-activations is NaN in the forward pass."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(3, name="hidden"), LogOfInput(name="log"),
                             keras.layers.Dense(1, name="out")])


def backward_nan(features=4):
    """Dense(zeros) -> sqrt(relu): outputs 0, gradient of sqrt at 0 is inf, times 0 -> NaN."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(3, kernel_initializer="zeros", name="hidden"),
                             SqrtOfRelu(name="sqrt"), keras.layers.Dense(1, name="out")])


def layer_norm_first(features=16):
    """A LayerNormalization on the inputs: its mean of rows near 3e37 overflows float32 in the forward pass."""
    return keras.Sequential([keras.Input((features,)), keras.layers.LayerNormalization(name="norm"),
                             keras.layers.Dense(1, name="out")])


def log_loss(y_true, y_pred):
    """A hand-written loss that takes the log of the prediction: -inf at 0."""
    return ops.mean(ops.log(ops.relu(y_pred)))


def functional(features=4):
    inputs = keras.Input((features,))
    a = keras.layers.Dense(5, activation="relu", name="a")(inputs)
    b = keras.layers.Dense(5, activation="tanh", name="b")(inputs)
    merged = keras.layers.Concatenate(name="merge")([a, b])
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(merged))


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(4, activation="relu", name="first")
        self.second = keras.layers.Dense(1, name="second")

    def call(self, x):
        return self.second(self.first(x))


def subclassed(features=4):
    return Subclassed()


def regularized(features=4):
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(0.1), name="reg"),
                             keras.layers.Dense(1, name="out")])


def compiled(features=4):
    model = dense(features)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def not_a_model(features=4):
    return "not a model"


def raises(features=4):
    raise RuntimeError("factory exploded")


def dead_relu(features=4):
    """Dense(zeros, relu) -> Dense: the hidden layer's gradients are exactly 0 (relu'(0) = 0)."""
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(3, activation="relu", kernel_initializer="zeros", name="hidden"),
                             keras.layers.Dense(1, name="out")])


def reward_large_outputs(y_true, y_pred):
    """A loss with no minimum: it keeps rewarding larger outputs, so the weights grow without bound."""
    return -ops.mean(y_pred)
