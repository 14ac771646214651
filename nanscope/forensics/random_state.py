"""The global random state an extra trace, build or replay by nanscope must leave as it found it.

An unseeded random op takes its seed when it is traced or run: Keras' legacy
`backend.random_normal` draws one from numpy's global generator at each trace,
`keras.random.normal(seed=None)` advances Keras' global SeedGenerator each time it runs
(and creates it from Python's `random` on first use). A trace nanscope adds to the user's (a build from
the first batch's shapes, the eager replay of a failing step) would take one more draw,
and the user's own graph would get other noise than without nanscope. `random_state_kept`
puts all three back after the block.
"""

import contextlib
import random
from collections.abc import Iterator

import numpy as np

from nanscope.internals import keras_global_seed_generator, set_keras_global_seed_generator


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Run the block, then put numpy's, Python's and Keras' global random state back.

    Example:
        with random_state_kept():
            model._symbolic_build(data_batch=spec)   # traces call: draws seeds nothing else sees
    """
    python, legacy = random.getstate(), np.random.get_state()
    keras_generator = keras_global_seed_generator()
    keras_seed = keras_generator.state.numpy() if keras_generator is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(legacy)
        set_keras_global_seed_generator(keras_generator)  # None again when the block created the first one
        if keras_seed is not None and not np.array_equal(keras_generator.state.numpy(), keras_seed):
            keras_generator.state.assign(keras_seed)
