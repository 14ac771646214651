"""The glitch finder and the data-scale measurements, each against a numpy reference or an exact value: the robust
scale per column, the cells a glitch row names, the walk out from the bulk that tells a detached value from a tail,
and the feature and target scales the scale rules judge (with the glitch rows left out).

Plain arrays, no model (docs/mutation.md lists what each test here was written to catch)."""

import math

import numpy as np
import pytest

from nanscope.report.model import FirstNonfinite
from nanscope.rules.drop_outlier_rows import _row_line, _spike, detect
from nanscope.rules.facts import Facts
from nanscope.rules.evidence import feature_scales, finite_spread, target_scales, without_glitches
from nanscope.rules.outliers import detached, glitch_rows, glitches_in, missing_value_codes, robust_scale

# Median 0 and MAD 1 whatever one glitch does (30 of -1, 39 of 0, 30 of 1): the robust std is 1.4826 exactly.
BULK = [-1.0] * 30 + [0.0] * 39 + [1.0] * 30
CODE = 9999.0
GLITCH_CELL = (CODE, CODE / 1.4826, 0.0, 1.4826)  # value, robust z, the column's median and robust std


def with_code():
    return np.array([*BULK, CODE])


def test_the_robust_scale_is_1_4826_mad_per_column_over_the_finite_values():
    values = np.array([[1.0, 0.0, 0.0], [2.0, 0.0, 0.5], [4.0, 0.0, 1.0], [8.0, 5.0, 1.5], [math.inf, 0.0, math.nan]])
    median, scale = robust_scale(values)
    # Column 0: median of 1, 2, 4, 8 is 3, deviations 2, 1, 1, 5, MAD 1.5. Column 1: MAD 0, so 1.2533 x the mean
    # absolute deviation (5 / 5 = 1). Column 2: median 0.75, MAD 0.5 (a scale below 1 is kept too).
    assert median.tolist() == [3.0, 0.0, 0.75]
    assert scale.tolist() == [1.4826 * 1.5, 1.2533 * 1.0, 1.4826 * 0.5]
    median, scale = robust_scale(np.array([[math.nan, 1.0], [math.nan, 2.0]]))
    assert math.isnan(median[0]) and math.isnan(scale[0]) and median[1] == 1.5 and scale[1] == 1.4826 * 0.5
    assert robust_scale(np.zeros((3, 2)))[1].tolist() == [0.0, 0.0]  # one value throughout: no spread at all


def test_a_glitch_row_names_its_column_value_z_median_and_scale():
    assert glitch_rows(with_code().reshape(-1, 1)) == {99: [(0, *GLITCH_CELL)]}
    beside = np.stack([np.array([*BULK, 0.0]), with_code()], axis=1)
    assert glitch_rows(beside) == {99: [(1, *GLITCH_CELL)]}
    assert glitch_rows(beside.reshape(100, 1, 2)) == {99: [(1, *GLITCH_CELL)]}  # every axis after the rows is flat
    both = np.stack([with_code(), with_code()], axis=1)
    assert glitch_rows(both) == {99: [(0, *GLITCH_CELL), (1, *GLITCH_CELL)]}
    assert glitch_rows(with_code().astype(np.int64).reshape(-1, 1)) == {}  # ids and counts have no glitches


def test_a_column_with_a_nan_still_finds_its_glitch():
    values = np.array([*BULK[:-1], math.nan, CODE]).reshape(-1, 1)  # 29 of 1 now: the median and MAD stay 0 and 1
    assert glitch_rows(values) == {99: [(0, *GLITCH_CELL)]}


def test_detached_walks_out_from_each_edge_and_keeps_everything_past_the_first_wide_gap():
    # Edges -1 and 1, scale 1: a gap must be over 10. Above: 11 (gap 10: not apart), 12 (gap 1), 30 (gap 18: apart),
    # 31 (gap 1, but past the gap). Below: -11.5 (gap 10.5: apart), -12. Given out of order on purpose.
    far = {31.0: 1, 11.0: 1, 30.0: 3, 12.0: 1, -12.0: 1, -11.5: 2}
    assert detached(far, -1.0, 1.0, 1.0) == {30.0: 3, 31.0: 1, -11.5: 2, -12.0: 1}
    assert detached(far, -1.0, 1.0, 2.0) == {}  # scale 2: no gap is over 20
    assert detached({-21.5: 1}, -1.0, 1.0, 2.0) == {-21.5: 1}  # the low side scales too: 20.5 > 20
    assert detached({-21.0: 1, 21.0: 1}, -1.0, 1.0, 2.0) == {}  # exactly 20 on both sides


def test_a_missing_value_code_is_a_detached_value_that_two_rows_or_more_share():
    assert missing_value_codes({9999.0: 2, -999.0: 3, 40.0: 1}) == {9999.0: 2, -999.0: 3}
    assert missing_value_codes({40.0: 1}) == {}


def test_glitches_are_looked_for_in_the_float_inputs_that_are_not_ids_and_in_every_target():
    x = np.stack([with_code(), np.linspace(0.0, 1.0, 100)], axis=1)
    found = glitches_in({"a": x, "tok": x}, [with_code(), with_code()[:50]], ids=("x['tok']",))
    assert found == {"x['a']": {99: [(0, *GLITCH_CELL)]}, "y[0]": {99: [(0, *GLITCH_CELL)]}}
    assert glitches_in(x, with_code()) == {"x": {99: [(0, *GLITCH_CELL)]}, "y": {99: [(0, *GLITCH_CELL)]}}


def test_finite_spread_is_numpys_std_and_mean_abs_over_the_finite_values():
    std, mean = finite_spread([[1.0, -2.0], [3.0, math.inf], [5.0, -4.0]], axis=0)
    assert std.tolist() == [np.std([1.0, 3.0, 5.0]), 1.0] and mean.tolist() == [3.0, 3.0]
    assert finite_spread([1.0, -3.0, math.nan]) == (2.0, 2.0)
    std, mean = finite_spread([math.nan, math.inf])
    assert math.isnan(std) and math.isnan(mean)


def test_without_glitches_drops_the_glitch_rows_only():
    x = np.stack([with_code(), np.arange(100.0)], axis=1)
    assert np.array_equal(without_glitches(x), x[:99])
    clean = np.array([*BULK, 0.0])
    assert without_glitches(clean) is clean


def test_feature_scales_name_each_column_and_leave_out_glitches_ids_and_integers():
    line = np.linspace(0.0, 1.0, 100)
    x = np.stack([with_code(), line], axis=1)
    bulk = np.array(BULK)
    assert [(f.name, f.key, f.std, f.mean_abs) for f in feature_scales(x, ["price"])] == [
        ("price", 0, np.std(bulk), np.mean(np.abs(bulk))),  # the glitch row is not the column's scale
        ("x[1]", 1, np.std(line[:99]), np.mean(line[:99])),  # nor the other columns' (the whole row goes)
    ]
    several = {"a": x, "tok": x, "n": np.arange(100).reshape(-1, 1)}
    assert [(f.name, f.key) for f in feature_scales(several, ["price"], ids=("x['tok']",))] == [
        ("x['a'][0]", "x['a'][0]"), ("x['a'][1]", "x['a'][1]")]  # names are for the single input only


@pytest.mark.parametrize("y, std, mean_abs", [
    pytest.param(with_code(), np.std(BULK), np.mean(np.abs(BULK)), id="floats-without-their-glitch"),
    pytest.param(np.arange(4), np.std([0, 1, 2, 3]), 1.5, id="whole-numbers"),
])
def test_target_scales_measure_number_targets_without_their_glitch_rows(y, std, mean_abs):
    assert [(t.output, t.loss, t.std, t.mean_abs) for t in target_scales([("price", "mse", y)])] == [
        ("price", "mse", std, mean_abs)]


def test_target_scales_skip_targets_that_are_not_numbers():
    assert target_scales([(None, "bce", np.array([True, False])), (None, "x", np.array(["a", "b"]))]) == []


@pytest.mark.parametrize("loss, before, spike", [
    pytest.param(101.0, [1.0], 101.0, id="over-100x-the-median"),
    pytest.param(100.0, [1.0], None, id="at-100x"),
    pytest.param(150.0, [100.0] * 5 + [1.0] * 20, 150.0, id="the-median-of-the-last-20"),
    pytest.param(5.0, [], None, id="no-loss-before"),
    pytest.param(5.0, [0.0] * 3, None, id="a-median-of-0"),
    pytest.param(math.inf, [1.0] * 5, None, id="a-non-finite-loss-is-no-spike"),
    pytest.param(math.nan, [1.0] * 5, None, id="nor-a-nan"),
])
def test_a_loss_spike_is_over_100x_the_median_of_the_20_finite_losses_before_it(loss, before, spike):
    assert _spike(loss, before) == spike


def test_the_low_side_is_walked_from_the_bulk_outward():
    # -11 first (a gap of 10: not apart), then -30 (a gap of 19: apart). Walked from -30 inward, both would be.
    assert detached({-11.0: 1, -30.0: 1}, -1.0, 1.0, 1.0) == {-30.0: 1}


@pytest.mark.parametrize("values, cell", [
    pytest.param([v + 100.0 for v in BULK] + [CODE], (CODE, (CODE - 100.0) / 1.4826, 100.0, 1.4826),
                 id="z-from-a-median-of-100"),
    pytest.param([v * 0.1 for v in BULK] + [999.9], (999.9, 999.9 / 0.14826, 0.0, 0.14826), id="a-scale-below-1"),
])
def test_the_z_score_is_the_distance_from_the_median_in_robust_std(values, cell):
    found = glitch_rows(np.array(values).reshape(-1, 1))
    assert found.keys() == {99} and found[99][0][0] == 0
    assert found[99][0][1:] == pytest.approx(cell, rel=1e-12)


def test_a_float32_column_has_glitches_too_but_an_infinite_value_is_not_one():
    assert glitch_rows(with_code().astype(np.float32).reshape(-1, 1)) == {99: [(0, *GLITCH_CELL)]}
    assert glitch_rows(np.array([*BULK, math.inf]).reshape(-1, 1)) == {}  # clean-input-data's, not a glitch


def test_every_column_with_a_far_value_is_checked_for_detachment():
    tail = float(np.nextafter(10 * 1.4826, math.inf))  # z just over 10, but 13.8 from the bulk's edge: a tail
    assert glitch_rows(np.stack([np.array([*BULK, 0.0]), np.array([*BULK, tail])], axis=1)) == {}


def test_feature_scales_measure_float32_inputs_in_float64_and_every_float_input():
    line = np.linspace(0.0, 1.0, 100, dtype=np.float32)
    wide, wide3 = line.astype(np.float64), (3 * line).astype(np.float64)
    # float32 sums would be off in the 8th digit
    found = feature_scales(np.stack([line, 3 * line], axis=1))
    assert [v for f in found for v in (f.std, f.mean_abs)] == pytest.approx(
        [np.std(wide), np.mean(wide), np.std(wide3), np.mean(wide3)], rel=1e-13)
    several = {"tok": line.reshape(-1, 1), "a": line.reshape(-1, 1), "b": line.reshape(-1, 1)}
    assert [f.name for f in feature_scales(several, ids=("x['tok']",))] == ["x['a'][0]", "x['b'][0]"]


def test_a_glitch_rows_line_quotes_its_cell_with_the_largest_z():
    cells = [(0, 9999.0, 6744.2, 0.0, 1.4826), (1, 50.0, 33.7, 0.0, 1.4826)]  # column 1 first by number, not by z
    assert _row_line("y", 7, cells) == "row 7: y[0] = 9999 (robust z 6.74e+03; median 0, robust std 1.48)"


def test_a_glitch_rows_line_picks_the_cell_by_z_not_by_median():
    cells = [(0, 9999.0, 6744.2, 0.0, 1.4826), (1, 50.0, 33.7, 40.0, 1.0)]  # the larger median in column 1
    assert _row_line("y", 7, cells) == "row 7: y[0] = 9999 (robust z 6.74e+03; median 0, robust std 1.48)"


def glitch(column, value, z=50.0, median=1.0, scale=2.0):
    return [(column, value, z, median, scale)]


def drop_rows(glitches, kept=((0, 1.0),), first=None, batch_rows=None):
    """drop-outlier-rows' one (score, Recommendation) for `glitches`, over the kept steps' (step, loss)."""
    (score, rec), = detect(Facts(run={}, first=first, kept=list(kept), glitches=glitches, batch_rows=batch_rows))
    return score, rec


def test_glitch_rows_without_batch_rows_score_0_3_as_info_and_quote_five_rows_and_count_the_rest():
    score, rec = drop_rows({"y": {row: glitch(0, 100.0 + row) for row in range(7)}})
    assert (score, rec.severity) == (0.3, "info") and "step" not in rec.data
    lines = "; ".join(f"row {row}: y[0] = {100 + row} (robust z 50; median 1, robust std 2)" for row in range(5))
    assert rec.evidence == ["7 training row(s) hold values over 10 robust standard deviations from their column's "
                            f"median (median and MAD of the column): {lines}; ... and 2 more"]
    _, five = drop_rows({"y": {row: glitch(0, 100.0 + row) for row in range(5)}})
    assert five.evidence[0].endswith(f": {lines}")


def test_the_data_keeps_the_first_100_glitch_rows():
    _, rec = drop_rows({"y": {row: glitch(0, 100.0) for row in range(101)}})
    assert rec.data["rows"] == list(range(100))


def test_a_missing_value_code_is_the_first_cells_value_in_the_same_column_of_at_least_2_rows():
    found = {3: glitch(0, 9999.0), 7: glitch(0, 9999.0), 9: glitch(1, 9999.0), 11: glitch(0, 5000.0)}
    _, rec = drop_rows({"x['price']": found})
    assert rec.fix.splitlines()[0] == "# rows 3, 7, 9, 11: x['price'][0] = 9999 in 2 rows (a missing-value code?)"
    assert rec.fix.splitlines()[2].endswith("# drop the rows; or repair: x[bad, 0] = np.nan, then impute")
    _, once = drop_rows({"y": {3: glitch(0, 9999.0), 9: glitch(1, 9999.0)}})
    assert once.fix.splitlines()[0] == "# rows 3, 9: y[0] = 9999"


def test_a_batch_whose_loss_spiked_with_glitch_rows_in_it_scores_0_97_and_names_the_step_and_rows():
    kept = [(0, 1.0), (1, 1.0), (2, 1000.0)]
    batch = lambda step: np.array([2 * step, 2 * step + 1])  # noqa: E731
    glitches = {"y": {4: glitch(0, 500.0), 5: glitch(0, 600.0)}}
    score, rec = drop_rows(glitches, kept, batch_rows=batch)
    assert (score, rec.severity, rec.data["step"]) == (0.97, "warning", 2)
    assert rec.evidence[0] == ("step 2: the loss spiked to 1000, 1e+03x the median of the 2 steps before; its batch "
                               "held row(s) 4, 5")
    # A run that went non-finite later: the spike is still what its batch did, and the glitch came first.
    later = FirstNonfinite(step=5, phase="loss")
    score, rec = drop_rows(glitches, kept, first=later, batch_rows=batch)
    assert (score, rec.severity) == (0.97, "error")
    assert rec.evidence[0].startswith("step 2: the loss spiked to 1000")
