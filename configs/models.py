"""Model factories for the bundled example run specs."""

import keras


def exploding_mlp(features=20, units=25):
    """Dense(25, relu, he_uniform) -> Dense(1): the classic exploding-gradient regression MLP."""
    return keras.Sequential(
        [
            keras.Input(shape=(features,)),
            keras.layers.Dense(units, activation="relu", kernel_initializer="he_uniform"),
            keras.layers.Dense(1, activation="linear"),
        ]
    )


def classifier(features=20, units=32, classes=3):
    """A small softmax classifier for the healthy example."""
    return keras.Sequential(
        [
            keras.Input(shape=(features,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )


def two_heads(features=12, units=32, classes=4):
    """A shared trunk with two heads: `price` (regression) and `kind` (class logits)."""
    inputs = keras.Input(shape=(features,), name="features")
    hidden = keras.layers.Dense(units, activation="relu", name="trunk")(inputs)
    price = keras.layers.Dense(1, name="price")(hidden)
    kind = keras.layers.Dense(classes, name="kind")(hidden)
    return keras.Model(inputs, [price, kind], name="two_heads")
