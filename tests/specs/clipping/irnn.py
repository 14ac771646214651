import numpy as np
import keras


def irnn(timesteps=60, features=2, units=16):
    """IRNN (Le et al., 2015): a relu SimpleRNN whose recurrent kernel starts as the identity."""
    return keras.Sequential([
        keras.Input((timesteps, features)),
        keras.layers.SimpleRNN(units, activation="relu", recurrent_initializer="identity", name="rnn"),
        keras.layers.Dense(1, name="out"),
    ])


def sequences(rows=128, timesteps=60, features=2, seed=0):
    """Random positive sequences and the sum of their first feature as the target (the adding problem's scale)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (rows, timesteps, features)).astype(np.float32)
    y = x[:, :, :1].sum(axis=1).astype(np.float32)
    return x, y
