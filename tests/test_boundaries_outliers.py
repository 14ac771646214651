"""drop-outlier-rows' thresholds: a robust z-score > 10 and a gap of 10 from the rest, at most 1% of the rows,
a loss spike > 100x the median of the 20 finite losses before it; and the severity that follows from
the step the glitch hit.

The column below has median 0 and MAD 1 whatever one or two glitch values do to it (30 values of -1,
38 or 39 of 0, 30 of 1), so a value's robust z-score is |value| / 1.4826 exactly.
"""

import math

import numpy as np
import pytest

from boundary_runs import down, fired, first_at, report_of, step, up
from nanscope.rules.evidence import RunEvidence
from nanscope.rules.outliers import glitches_in

ROBUST_STD = 1.4826  # 1.4826 x MAD, with MAD 1
AT_Z10 = 10 * ROBUST_STD  # 14.826 / 1.4826 == 10.0 exactly in float64


def column(glitches, copies=1):
    """A float64 target column of 100 * `copies` rows: the values above, then `glitches` in place of some zeros."""
    base = [-1.0] * 30 + [0.0] * (40 - len(glitches)) + [1.0] * 30 + list(glitches)
    values = np.array(base * copies, dtype=np.float64)
    return values.reshape(-1, 1)


def glitch_rows_of(y):
    return {row for found in glitches_in(np.zeros((len(y), 1)), y).values() for row in found}


# A far value must also stand apart: a gap of over 10 robust std from the bulk's edge (1 or -1 here), which a long
# tail does not leave (rules.outliers.detached).
APART = 1.0 + AT_Z10
GLITCH_Z = [
    pytest.param(down(AT_Z10), False, id="z-below-10"),
    pytest.param(AT_Z10, False, id="z-at-10"),
    pytest.param(up(AT_Z10), False, id="z-above-10-but-not-apart"),
    pytest.param(APART - 1e-9, False, id="gap-just-below-10"),
    pytest.param(APART + 1e-9, True, id="gap-just-above-10"),
    pytest.param(-(APART + 1e-9), True, id="gap-just-above-10-negative"),
    pytest.param(9999.0, True, id="a-missing-value-code"),
]


@pytest.mark.parametrize("value, found", GLITCH_Z)
def test_a_glitch_is_over_10_robust_standard_deviations_out(value, found):
    assert glitch_rows_of(column([value])) == ({99} if found else set())  # the last row


@pytest.mark.parametrize("glitches, copies, found", [
    pytest.param(1, 1, {99}, id="1-of-100-rows"),
    pytest.param(2, 1, set(), id="2-of-100-rows-a-tail"),
    pytest.param(3, 2, set(), id="6-of-200-rows-a-tail"),
    pytest.param(1, 2, {99, 199}, id="2-of-200-rows"),
])
def test_at_most_one_percent_of_the_rows_are_glitches(glitches, copies, found):
    assert glitch_rows_of(column([9999.0] * glitches, copies)) == found


# The glitch row 99 is in step 21's batch. Before it, 11 losses of 1 and 10 of 3: the median of the last 20 is 2,
# of the last 21 it is 1, of the last 19 it is 3.
GLITCH_ROW, HIT = 99, 21
BEFORE = [1.0] * 11 + [3.0] * 10


def run_with_spike(loss, first=None, nonfinite_at=None):
    records = [step(s, loss=value) for s, value in enumerate(BEFORE)] + [step(HIT, loss=loss), step(HIT + 1)]
    if nonfinite_at is not None:
        records[nonfinite_at] = step(nonfinite_at, loss=math.nan, loss_nonfinite=True)
    report = report_of(records, first)
    y = column([9999.0])
    evidence = RunEvidence(glitches=glitches_in(np.zeros((100, 1)), y),
                           batch_rows=lambda s: np.array([GLITCH_ROW if s == HIT else 0]))
    return fired(report, evidence)["drop-outlier-rows"]


SPIKE = [
    pytest.param(150.0, None, id="150-below-100x-the-median-of-20"),  # 100x the median of the last 21 is 100
    pytest.param(200.0, None, id="at-100x"),
    pytest.param(up(200.0), HIT, id="above-100x"),
    pytest.param(250.0, HIT, id="250-above-100x-the-median-of-20"),  # 100x the median of the last 19 is 300
]


@pytest.mark.parametrize("loss, hit", SPIKE)
def test_a_glitch_is_tied_to_the_step_whose_loss_spiked(loss, hit):
    rec = run_with_spike(loss)
    assert rec.data.get("step") == hit and rec.data["rows"] == [GLITCH_ROW]
    # Tied to no step, a glitch is a hint; tied to a spike in a run that stayed finite, a warning.
    assert rec.severity == ("warning" if hit is not None else "info")
    if hit is not None:
        assert rec.evidence[0] == (f"step {HIT}: the loss spiked to {loss:.4g}, {loss / 2:.3g}x the median of the 20 "
                                   f"steps before; its batch held row(s) {GLITCH_ROW}")


@pytest.mark.parametrize("nonfinite_at, severity", [
    pytest.param(HIT + 1, "error", id="the-run-failed-after-the-spike"),
    pytest.param(HIT - 1, "warning", id="the-run-failed-before-the-spike"),
])
def test_a_glitch_is_an_error_when_the_run_failed_at_or_after_its_step(nonfinite_at, severity):
    # A NaN loss before the spike leaves it out of the median (11 ones and 9 threes: 1): 250 still spikes.
    rec = run_with_spike(250.0, first_at(nonfinite_at), nonfinite_at)
    assert (rec.data["step"], rec.severity) == (HIT, severity)


def test_a_glitch_in_the_batch_of_the_first_nonfinite_step_is_tied_to_it():
    rec = run_with_spike(1.0, first_at(HIT, "forward"), HIT)
    assert (rec.data["step"], rec.severity) == (HIT, "error")
    assert rec.evidence[0] == (f"step {HIT}: the first non-finite value (forward phase); its batch held row(s) "
                               f"{GLITCH_ROW}")
