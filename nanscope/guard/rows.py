"""Each row's loss of a `fit` batch, for the rows a spike names (the compiled loss, one value per row)."""

from collections.abc import Callable

import numpy as np

from nanscope.runtime import tensorflow

from nanscope.tf_types import Batch, KerasModel


def fit_row_losses(model: KerasModel) -> Callable[[Batch], np.ndarray] | None:
    """A callable(batch) -> each row's loss under the model's compiled loss, or None for a loss it cannot split.

    One loss (a name, a function or a `keras.losses.Loss`) is split per row; a dict or list
    of losses (a multi-output model) is not.
    """
    _, keras = tensorflow()
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        loss = loss.call  # unreduced: one value per row (and per timestep)
    if not callable(loss):
        return None

    def row_losses(batch: Batch) -> np.ndarray:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
        if y is None:
            return np.zeros(0)
        values = np.asarray(loss(y, model(x, training=False)), np.float64)
        return values.reshape(values.shape[0], -1).mean(axis=1) if values.ndim else values.reshape(1)

    return row_losses
