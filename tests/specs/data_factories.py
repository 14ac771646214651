"""Data factories: arrays and a tf.data.Dataset."""

import numpy as np


def arrays(rows=64, features=4, nan_rows=(), scale=1.0, target_scale=1.0, growth=1.0, block=16):
    """Random regression rows; with `growth`, each block of `block` rows is `growth` times larger than the last."""
    rng = np.random.default_rng(0)
    x = scale * rng.standard_normal((rows, features)) * growth ** (np.arange(rows) // block)[:, None]
    x = x.astype(np.float32)
    for row in nan_rows:
        x[row, 1] = np.nan
    y = (target_scale * (x[:, :1] * 2.0 + 1.0)).astype(np.float32)
    return x, np.nan_to_num(y)


def constant_rows(rows=64, features=16, value=3e37):
    """Every feature of every row `value` (finite), with targets of 1."""
    return np.full((rows, features), value, np.float32), np.ones((rows, 1), np.float32)


def dataset(rows=64, features=4):
    import tensorflow as tf

    x, y = arrays(rows, features)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def late_spike(rows=96, features=4, block=16, spike_block=4, spike=20.0, target_scale=1.0):
    """Random regression rows whose batch `spike_block` (of `block` rows, unshuffled) is `spike` times larger."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    y = (target_scale * (x[:, :1] * 2.0 + 1.0)).astype(np.float32)
    x[spike_block * block:(spike_block + 1) * block] *= spike
    return x, y


def exp_counts(rows=256, features=4, level=11.5):
    """Random rows and positive targets exp(level + x0 / 2): their log has mean `level` and std 0.5."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    return x, np.exp(level + 0.5 * x[:, :1]).astype(np.float32)
