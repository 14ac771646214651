"""The trend fit's window and the overflow projection of clip-gradients, each against an exact value: how many trailing
steps a fit steeper than the limit can span, and the step at which a norm growing geometrically passes float32's max.

Plain numbers, no model (docs/mutation.md lists what each test here was written to catch)."""

import math

import numpy as np
import pytest

from nanscope.rules.clip_gradients import projected_overflow_step
from nanscope.rules.trends import fit_window

FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("spread, rate_limit, window", [
    pytest.param(math.e ** 2, math.e, 5, id="sqrt3-x-2-over-1-plus-2"),  # int(3.46) + 2
    pytest.param(1e6, 1.2, 133, id="a-million-at-1.2"),  # int(sqrt(3) ln(1e6) / ln(1.2)) + 2
    pytest.param(1.0, 1.2, 2, id="no-spread"),
    pytest.param(0.5, 1.2, 2, id="a-spread-below-1-counts-as-1"),
    pytest.param(math.inf, 1.2, None, id="an-infinite-spread-has-no-bound"),
    pytest.param(math.nan, 1.2, None, id="a-nan-spread-has-no-bound"),
    pytest.param(100.0, 1.0, None, id="a-limit-of-1-has-no-bound"),
    pytest.param(100.0, 0.5, None, id="a-limit-below-1-has-no-bound"),
])
def test_the_fit_window_is_sqrt3_ln_spread_over_ln_limit_plus_2(spread, rate_limit, window):
    assert fit_window(spread, rate_limit) == window


@pytest.mark.parametrize("step, norm, rate, overflow", [
    pytest.param(10, FLOAT32_MAX / 1024, 2.0, 20.0, id="1024x-left-at-2x-per-step"),
    pytest.param(3, FLOAT32_MAX, 2.0, 3.0, id="at-the-max-now"),
    pytest.param(0, 1.0, math.nextafter(1.0, 2.0), 0.0 + math.log(FLOAT32_MAX) / math.log(math.nextafter(1.0, 2.0)),
                 id="the-smallest-rate-over-1"),
    pytest.param(10, 0.0, 2.0, None, id="a-norm-of-0"),
    pytest.param(10, -1.0, 2.0, None, id="a-negative-norm"),
    pytest.param(10, math.inf, 2.0, None, id="an-infinite-norm"),
    pytest.param(10, 1.0, 1.0, None, id="a-rate-of-1"),
    pytest.param(10, 1.0, math.inf, None, id="an-infinite-rate"),
    pytest.param(10, 5e-324, 2.0, None, id="a-denormal-norm-overflows-the-ratio"),
])
def test_the_projected_overflow_step_is_where_the_norm_passes_float32s_max(step, norm, rate, overflow):
    assert projected_overflow_step(step, norm, rate) == overflow
