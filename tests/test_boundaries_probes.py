"""The layer probe's healthy path on outputs whose every |x| is below 1, and on an empty output.

A large output (rows of more than exact.SMALL_ROW_SIZE entries) takes the cheap path: a max and a sum
of |x|, floored at 0 because the max of an empty tensor is -inf. That floor must be 0: an
output of magnitudes below 1 keeps its own max |x|, which numpy gives here.
"""

import numpy as np
import pytest

from nanscope.engine.exact import SMALL_ROW_SIZE
from nanscope.engine.probes import tensor_stats
from nanscope.engine.schema import LAYER
from nanscope.runtime import tensorflow

tf, _ = tensorflow()
WIDTH = 300  # rows of 300 > SMALL_ROW_SIZE (32) entries, batch unknown: the healthy path, not the exact one


@pytest.mark.parametrize("count_zeros", [None, False], ids=["zeros-counted", "zeros-not-counted"])
@pytest.mark.parametrize("scale", [0.5, 1e-3, 1e-30])
def test_a_large_output_below_1_keeps_its_own_max(count_zeros, scale):
    assert WIDTH > SMALL_ROW_SIZE
    output = (np.random.default_rng(0).uniform(-1, 1, (16, WIDTH)) * scale).astype(np.float32)
    schedule = None if count_zeros is None else tf.constant(count_zeros)
    row = tf.function(lambda x: tensor_stats([x], schedule), autograph=False,
                      input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])(output).numpy()
    named = LAYER.named(row.tolist())
    assert named["max_abs"] == np.abs(output).max() and named["max_abs"] < scale
    assert named["sum_abs"] == pytest.approx(float(np.abs(output.astype(np.float64)).sum()), rel=1e-5)
    assert (named["nonfinite"], named["size"]) == (0.0, 16 * WIDTH)
    assert named["zeros"] == (0.0 if count_zeros is None else -1.0)  # -1: not counted on this step


def test_an_empty_large_output_has_max_0():
    spec = tf.TensorSpec([None, WIDTH], tf.float32)
    row = tf.function(lambda x: tensor_stats([x], tf.constant(False)), autograph=False,
                      input_signature=[spec])(np.zeros((0, WIDTH), np.float32)).numpy()
    named = LAYER.named(row.tolist())
    assert (named["max_abs"], named["sum_abs"], named["size"]) == (0.0, 0.0, 0.0)
