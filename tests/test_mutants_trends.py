"""The trend fit's window and the overflow projection of clip-gradients, each against an exact value: how many trailing
steps a fit steeper than the limit can span, and the step at which a norm growing geometrically passes float32's max.

Plain numbers, no model (docs/mutation.md lists what each test here was written to catch)."""

import math

import numpy as np
import pytest

from nanscope.rules.clip_gradients import projected_overflow_step
from nanscope.rules.trends import fit_window, geometric_growth

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


def reference_growth(steps, values, rate_limit, min_steps, min_total):
    """geometric_growth written out slowly: one `np.polyfit` per start, every start (no fit window), the sustain
    checks spelled as its docstring says them, over the same evenly spread candidates (SUSTAIN_CHECKS)."""
    if not len(values) or not (math.isfinite(values[-1]) and values[-1] > 0):
        return None
    kept = [(s, v) for s, v in zip(steps, values) if math.isfinite(v) and v > 0]
    if len(kept) < max(min_steps, 2):
        return None
    steps, values = np.array([s for s, _ in kept], float), np.array([v for _, v in kept])
    logs = np.log(values)
    candidates = []
    for start in range(len(kept) - min_steps + 1):
        if len(set(steps[start:])) < 2:
            continue
        rate = math.exp(np.polyfit(steps[start:], logs[start:], 1)[0])
        if rate > rate_limit and values[-1] / values[start] > min_total:
            candidates.append((start, rate))
    for start, rate in candidates[::max(1, len(candidates) // 200)]:
        jumps = np.diff(logs[start:])
        factors = jumps / np.diff(steps[start:])
        head = factors[:max(2, len(factors) // 3)]  # the first third of the steps from the start, at least two
        sustained = min(np.median(factors), np.median(head)) > math.log(math.sqrt(rate_limit))
        if sustained and jumps.sum() - jumps.max() > math.log(math.sqrt(min_total)):
            return rate, int(steps[start])
    return None


def piecewise_runs(count=60, seed=0):
    """Runs of 2 to 43 steps: up to three geometric segments (factors 0.8 to 3, the first at most 1.1), noise, now
    and then a gap in the step numbers, a zero or a non-finite value, and a limit, minimum length and minimum total
    to judge them by."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        values = [float(rng.uniform(0.5, 2.0))]
        for segment in range(int(rng.integers(1, 4))):
            factor = float(rng.choice([0.8, 1.0, 1.02, 1.1] if segment == 0 else [0.8, 1.0, 1.1, 1.3, 1.6, 2.0, 3.0]))
            for _ in range(int(rng.integers(1, 15))):
                values.append(values[-1] * factor * float(rng.lognormal(0.0, rng.choice([0.0, 0.05, 0.3]))))
        steps = np.cumsum(rng.choice([1, 1, 1, 1, 2, 5], size=len(values))).tolist()
        if rng.random() < 0.2:
            values[int(rng.integers(0, len(values) - 1))] = float(rng.choice([0.0, math.nan, math.inf]))
        yield steps, values, float(rng.choice([1.05, 1.2, 1.5])), int(rng.choice([2, 3, 4, 6])), float(
            rng.choice([1.5, 10.0, 100.0]))


def same_growth(found, expected):
    if expected is None:
        return found is None
    return found is not None and found[1] == expected[1] and found[0] == pytest.approx(expected[0], rel=1e-9)


def test_the_growth_fit_is_the_slow_polyfit_per_start_with_its_sustain_checks():
    outcomes = []
    for steps, values, rate_limit, min_steps, min_total in piecewise_runs():
        expected = reference_growth(steps, values, rate_limit, min_steps, min_total)
        found = geometric_growth(steps, values, rate_limit, min_steps, min_total)
        assert same_growth(found, expected), (steps, values, rate_limit, min_steps, min_total, found, expected)
        outcomes.append(None if expected is None else expected[1] == steps[0])
    # Both answers and onsets after the first step occur, so each decision is exercised both ways.
    assert outcomes.count(None) >= 10 and outcomes.count(False) >= 5 and outcomes.count(True) >= 5, outcomes


@pytest.mark.parametrize("values, rate_limit, min_steps, min_total, onset", [
    pytest.param([2.0 ** k for k in range(10)], 1.2, 4, 10.0, 0, id="doubling-from-step-0"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 1.2, 4, 8.0, None, id="a-total-of-exactly-min-total"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 1.2, 4, math.nextafter(8.0, 0.0), 0, id="a-total-just-above"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 2.0, 4, 2.0, None, id="a-rate-of-exactly-the-limit"),
    pytest.param([1.0, 2.0, 4.0], 1.2, 4, 2.0, None, id="fewer-steps-than-min-steps"),
    pytest.param([1.0, 2.0, 4.0], 1.2, 3, 2.0, 0, id="as-many-steps-as-min-steps"),
    pytest.param([1.0, 5.0], 1.2, 1, 2.0, None, id="two-steps-are-one-jump-and-nothing-without-it"),
    pytest.param([5.0], 1.2, 1, 0.5, None, id="one-step-is-no-fit-whatever-min-steps"),
    pytest.param([1.0, 2.0, 4.0, 8.0, 16.0, 0.0], 1.2, 3, 2.0, None, id="ending-at-zero"),
    pytest.param([1.0, 2.0, 4.0, 8.0, math.nan], 1.2, 3, 2.0, None, id="ending-non-finite"),
    pytest.param([1.0, math.inf, 4.0, 8.0, 16.0], 1.2, 3, 2.0, 0, id="a-non-finite-value-is-left-out"),
    pytest.param([1.0, -4.0, 0.0, 8.0, 16.0], 1.2, 3, 2.0, 0, id="a-value-not-above-0-is-left-out"),
    # The 4-step fit that ends at the spike passes; every earlier start has a flat median (test_outliers' case).
    pytest.param([1.0] * 12 + [1e12, 1e30], 1.2, 4, 10.0, 10, id="flat-then-one-spike"),
    # From step 3 two flat factors of 14, under the first third's half: the median is rising; from 2, three.
    pytest.param([1.0] * 6 + [1.5 ** k for k in range(1, 13)], 1.2, 4, 10.0, 3, id="flat-then-rising"),
    # Without its one large jump the value grew only 1.2x: under sqrt(10).
    pytest.param([1.0, 1.1, 1.2, 1e3, 1.1e3, 1.2e3], 1.05, 3, 10.0, None, id="one-jump-is-no-sustained-rise"),
])
def test_the_growth_fit_on_known_runs(values, rate_limit, min_steps, min_total, onset):
    steps = list(range(len(values)))
    found = geometric_growth(steps, values, rate_limit, min_steps, min_total)
    assert same_growth(found, reference_growth(steps, values, rate_limit, min_steps, min_total))
    assert (None if found is None else found[1]) == onset


def test_past_200_candidate_starts_every_nth_is_checked():
    # 300 flat steps, then 200 rising 1.5x a step: each of the ~500 starts fits steeper than 1.01 and ends over 2x
    # higher, so about every second candidate is checked; the first sustained rise starts where the flat part
    # is under half of the first third of the steps after it.
    values = [1.0] * 300 + [1.5 ** k for k in range(1, 201)]
    steps = list(range(len(values)))
    expected = reference_growth(steps, values, 1.01, 3, 2.0)
    found = geometric_growth(steps, values, 1.01, 3, 2.0)
    assert same_growth(found, expected) and 255 < expected[1] < 300, (found, expected)
