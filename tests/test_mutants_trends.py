"""The trend fit's window and the overflow projection of clip-gradients, each against an exact value: how many trailing
steps a fit steeper than the limit can span, and the step at which a norm growing geometrically passes float32's max.

Plain numbers, no model (docs/mutation.md lists what each test here was written to catch)."""

import math
import warnings

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


@pytest.mark.parametrize("steps, values, rate_limit, min_steps, min_total, expected", [
    # Two steps 1 apart: the fit's denominator n * sum(x^2) - sum(x)^2 is exactly 1, and the one jump is 5x; with a
    # minimum total under 1, nothing without the jump need grow.
    pytest.param([0, 1], [1.0, 5.0], 1.2, 1, 0.5, (4.999999999999999, 0), id="two-steps-with-a-total-under-1"),
    # ln(1e308 / 5e-324) = 1453 per step: the slope is clipped to 700 before exp, the rate is e^700, not inf.
    pytest.param([0, 1], [5e-324, 1e308], 1.2, 2, 0.5, (math.exp(700), 0), id="a-slope-over-700-is-clipped"),
    # A rise that ends below 1 still ends above 0.
    pytest.param(list(range(10)), [2.0 ** (k - 12) for k in range(10)], 1.2, 4, 10.0, (2.0, 0), id="ending-below-1"),
    # A limit of 1 has no fit window (fit_window is None): the whole run is fitted.
    pytest.param([0, 1, 2, 3], [1.0, 2.0, 4.0, 8.0], 1.0, 3, 2.0, (1.9999999999999998, 0), id="a-limit-of-1"),
    # 1e-300 to 1e300: the spread overflows to inf, which has no fit window either.
    pytest.param(list(range(8)), list(np.logspace(-300, 300, 8)), 1.2, 3, 2.0, (5.179474679231176e+85, 0),
                 id="an-infinite-spread"),
    # Log factors -1, 1, 1, 1, 1: from step 0 the head is the first two factors (5 // 3 = 1, at least 2), median 0;
    # the first three would have median 1. From step 1 every factor is 1.
    pytest.param(list(range(6)), list(np.exp([0.0, -1.0, 0.0, 1.0, 2.0, 3.0])), 1.2, 2, 2.0, (math.e, 1),
                 id="the-head-is-at-least-two-factors-not-three"),
])
def test_the_growth_fit_exactly(steps, values, rate_limit, min_steps, min_total, expected):
    assert geometric_growth(steps, values, rate_limit, min_steps, min_total) == expected


def test_a_fitted_rate_of_exactly_the_limit_does_not_exceed_it():
    steps, values = list(range(6)), [3.0 ** k for k in range(6)]
    rate, onset = geometric_growth(steps, values, 1.2, 3, 2.0)
    assert (rate, onset) == (2.9999999999999996, 0)
    assert geometric_growth(steps, values, math.nextafter(rate, 0.0), 3, 2.0) == (rate, 0)
    # At exactly the fitted rate, step 0's fit does not pass; step 3's, fitted over the last three, does.
    assert geometric_growth(steps, values, rate, 3, 2.0) == (3.0000000000000004, 3)


def test_a_median_factor_of_exactly_half_the_log_limit_is_not_sustained():
    # Log factors 2, 2, 0.25, 0.125, 0.125 against a limit of e^0.5: the median is exactly 0.5 ln(limit), not over it.
    values = list(np.exp(np.cumsum([0.0, 2.0, 2.0, 0.25, 0.125, 0.125])))
    limit = 1.6487212707001282
    assert np.median(np.diff(np.log(values))) == 0.5 * math.log(limit) == 0.25  # the premise, exactly
    assert geometric_growth(list(range(6)), values, limit, 3, 2.0) is None
    assert geometric_growth(list(range(6)), values, math.nextafter(limit, 0.0), 3, 2.0) is not None


def test_growth_without_the_largest_jump_of_exactly_sqrt_min_total_is_not_sustained():
    # Log jumps 0.5, 0.5, 3: without the largest the value grew e^1, exactly sqrt(e^2).
    values = list(np.exp([0.0, 0.5, 1.0, 4.0]))
    min_total = 7.38905609893065
    jumps = np.diff(np.log(values))
    assert jumps.sum() - jumps.max() == 0.5 * math.log(min_total) == 1.0  # the premise, exactly
    assert geometric_growth([0, 1, 2, 3], values, 1.2, 2, min_total) is None
    assert geometric_growth([0, 1, 2, 3], values, 1.2, 2, min_total * (1 - 1e-12))[1] == 0


def test_the_growth_fit_reads_float32_values_and_steps_as_float64():
    steps = np.arange(30)
    values = np.float32(1.7) ** np.arange(30, dtype=np.float32) * np.float32(1.3)
    expected = geometric_growth(steps.tolist(), values.astype(np.float64).tolist(), 1.2, 4, 10.0)
    assert geometric_growth(steps.astype(np.float32), values, 1.2, 4, 10.0) == expected
    half = values[:18].astype(np.float16)  # 1.3 * 1.7^17 = 10,720: under float16's max
    assert geometric_growth(steps[:18], half, 1.2, 4, 10.0) == geometric_growth(
        steps[:18].tolist(), half.astype(np.float64).tolist(), 1.2, 4, 10.0)


def test_a_long_run_is_fitted_over_its_last_fit_window_steps_only():
    # 5,000 flat steps, then 40 rising 1.5x: the fit window is 156 steps, and the answer (to the last bit, since the
    # steps are centred on the same mean) is the answer for those 156 alone.
    values = [1.0] * 5000 + [1.5 ** k for k in range(1, 41)]
    steps = list(range(len(values)))
    assert fit_window(1.5 ** 40, 1.2) == 156
    found = geometric_growth(steps, values, 1.2, 4, 10.0)
    assert found == geometric_growth(steps[-156:], values[-156:], 1.2, 4, 10.0)
    assert found[1] == 4991


def test_a_one_step_fit_warns_nothing():
    # With min_steps 1 the last start is one point: 0 / 0, NaN, silently.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert geometric_growth([0, 1, 2, 3], [1.0, 2.0, 4.0, 8.0], 1.2, 1, 2.0) == (1.9999999999999998, 0)
