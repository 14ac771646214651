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
