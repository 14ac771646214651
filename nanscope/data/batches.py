"""The order in which batches are drawn: seeded, reproducible, random-access.

Step k's batch is a pure function of (rows, batch_size, shuffle, seed, k), so a
replay of one step, a clipping strategy or a verification run sees exactly the
batch the traced run saw, without iterating up to it. Each epoch has its own
permutation seeded by (seed, epoch); the last partial batch of an epoch is kept,
as Keras' `fit` does.
"""

from typing import Any

import numpy as np

from nanscope.data.targets import Arrays, take


class BatchOrder:
    """Which rows make up the batch of each step.

    Args:
        rows: int. Number of training rows.
        batch_size: int. Rows per batch (the last batch of an epoch may be smaller).
        shuffle: bool. Permute rows each epoch; with False, batch k holds rows k*batch_size onwards.
        seed: int. Seed of the per-epoch permutations.

    Example:
        order = BatchOrder(500, 32, shuffle=False, seed=0)
        order.indices(0)  # array([0, ..., 31])
    """

    def __init__(self, rows: int, batch_size: int, shuffle: bool, seed: int) -> None:
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.steps_per_epoch = -(-rows // batch_size)
        self._permutations: dict[int, np.ndarray] = {}

    def indices(self, step: int) -> np.ndarray:
        """Row indices of the batch drawn at `step` (numbered from 0)."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.batch_size
        stop = min(start + self.batch_size, self.rows)
        if not self.shuffle:
            return np.arange(start, stop)
        return self._permutation(epoch)[start:stop]

    def uniform_run(self, first: int, stop: int) -> list[int]:
        """Steps first, first+1, ... (before `stop`) whose batches all have the size of `first`'s.

        An epoch's last, smaller batch ends a run, so each run can be stacked into one array.
        """
        size = len(self.indices(first))
        steps = [first]
        while steps[-1] + 1 < stop and self._size(steps[-1] + 1) == size:
            steps.append(steps[-1] + 1)
        return steps

    def _size(self, step: int) -> int:
        position = step % self.steps_per_epoch
        return min(self.batch_size, self.rows - position * self.batch_size)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            self._permutations = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.rows)}
        return self._permutations[epoch]


def batch(data: Any, order: BatchOrder, step: int) -> tuple[Arrays, Arrays]:
    """(x, y) numpy arrays of the batch at `step`; y is a tuple of arrays for a multi-output model."""
    idx = order.indices(step)
    return take(data.x, idx), take(data.y, idx)
