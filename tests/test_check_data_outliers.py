"""check-data's robust z-score per column: median and MAD, an exact count and the worst rows.

The reference is numpy on the whole array: np.median, the MAD, |x - median| / (1.4826 MAD).
"""

import numpy as np
import pytest

from nanscope.checkdata.scan import scan_data

GLITCHES = [200, 205, 40_000]


def robust_z(y):
    median = np.median(y)
    return np.abs(y - median) / (1.4826 * np.median(np.abs(y - median)))


def regression(rows, glitches=()):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -0.5, 0.2, 0.0]) + 0.1 * rng.standard_normal(rows)).astype(np.float32)[:, None]
    y[list(glitches)] = 9999.0
    return x, y


def test_a_missing_value_code_is_counted_exactly_with_its_rows_and_not_standardised(tmp_path):
    # 50 000 rows: more than the sample keeps, so median and MAD are estimated from every k-th row.
    x, y = regression(50_000, GLITCHES)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    scan = scan_data(tmp_path / "d.npz", chunk_rows=4096)
    column = scan.targets[0]
    z = robust_z(y[:, 0].astype(np.float64))
    assert column.outliers == int((z > 10).sum()) == len(GLITCHES)
    assert sorted(row for row, _, _ in column.outlier_rows) == GLITCHES
    assert all(value == 9999.0 for _, value, _ in column.outlier_rows)
    assert abs(column.median - np.median(y)) < 0.05 and abs(column.robust_std / (1.4826 * np.median(
        np.abs(y - np.median(y)))) - 1) < 0.05
    found = {r.id: r for r in scan.recommendations}
    assert found["drop-outlier-rows"].severity == "warning" and found["drop-outlier-rows"].data["rows"] == GLITCHES
    assert "normalize-targets" not in found  # y's std is ~45 only because of the three 9999s
    assert y.std() > 10


def test_clean_columns_have_no_outliers_and_a_heavy_tail_is_only_info(tmp_path):
    x, y = regression(3000)
    np.savez(tmp_path / "clean.npz", x=x, y=y)
    scan = scan_data(tmp_path / "clean.npz")
    assert all(c.outliers == 0 and c.max_robust_z < 10 for c in scan.inputs + scan.targets)
    assert "drop-outlier-rows" not in [r.id for r in scan.recommendations]
    tail = np.random.default_rng(1).lognormal(0.0, 2.0, size=(3000, 1)).astype(np.float32)
    assert (robust_z(tail[:, 0].astype(np.float64)) > 10).mean() > 0.01
    np.savez(tmp_path / "tail.npz", x=tail, y=y)
    found = {r.id: r for r in scan_data(tmp_path / "tail.npz").recommendations}
    assert found["drop-outlier-rows"].severity == "info" and "heavy tail" in found["drop-outlier-rows"].evidence[-1]


def long_tail_columns(rows, rng):
    """Real long tails: waiting times (exponential) and incomes (lognormal), as a csv would hold them."""
    return np.column_stack([rng.exponential(300.0, rows), rng.lognormal(10.0, 0.6, rows),
                            rng.normal(50.0, 10.0, rows)]).astype(np.float32)


def test_long_tails_are_not_missing_value_codes_and_keep_their_rows(tmp_path):
    rng = np.random.default_rng(3)
    x = long_tail_columns(20_000, rng)
    z = np.column_stack([robust_z(x[:, i].astype(np.float64)) for i in range(3)])
    assert (z[:, 0] > 10).sum() > 0 and (z[:, 1] > 10).sum() > 0  # far values there are: the tail's own
    np.savez(tmp_path / "d.npz", x=x, y=rng.standard_normal((20_000, 1)).astype(np.float32))
    scan = scan_data(tmp_path / "d.npz")
    waiting, income, _ = scan.inputs
    for column in (waiting, income):
        assert column.outliers == int((robust_z(x[:, scan.inputs.index(column)].astype(np.float64)) > 10).sum())
        assert column.detached_rows == 0 and column.codes == [] and column.clean_std is None
    found = [r for r in scan.recommendations if r.id == "drop-outlier-rows"]
    assert [r.severity for r in found] == ["info"]  # a long tail: info, never "drop or repair"
    text = " ".join(found[0].evidence) + found[0].fix
    assert "missing-value code" not in text and "heavy tail" in text and "log1p(np.abs(x[:, 0]))" in found[0].fix


def test_a_9999_code_is_named_indexed_in_its_own_array_and_left_out_of_the_scale(tmp_path):
    """Input column 2 holds a 9999 missing-value code in 12 rows: the snippet indexes x[:, 2], and the
    scale is judged on the other 1988 rows, whose exact std the JSON carries."""
    rng = np.random.default_rng(4)
    x = long_tail_columns(2000, rng)
    codes = rng.choice(2000, 12, replace=False)
    x[codes, 2] = 9999.0
    np.savez(tmp_path / "d.npz", x=x, y=rng.standard_normal((2000, 1)).astype(np.float32))
    scan = scan_data(tmp_path / "d.npz")
    coded = scan.inputs[2]
    kept = np.delete(x[:, 2], codes).astype(np.float64)
    assert coded.codes == [[9999.0, 12]] and coded.detached_rows == 12
    assert coded.std == pytest.approx(x[:, 2].astype(np.float64).std(), rel=1e-6)  # 768: the codes' doing
    assert coded.clean_std == pytest.approx(kept.std(), rel=1e-12) and coded.clean_mean == pytest.approx(kept.mean(),
                                                                                                         rel=1e-12)
    warning = next(r for r in scan.recommendations if r.id == "drop-outlier-rows" and r.severity == "warning")
    assert warning.evidence[0].startswith("x[2]: 12 rows hold exactly 9999, ") and "missing-value code?" in \
        warning.evidence[0]
    assert warning.fix.startswith("bad = x[:, 2] == 9999   # x[2]: the code in 12 rows\n")
    assert "y[:, 0]" not in warning.fix
    scale = next(r for r in scan.recommendations if r.id == "normalize-inputs")
    line = next(line for line in scale.evidence if line.startswith("x[2]"))
    assert f"std {kept.std():.4g} without its 12 detached row(s)" in line
    assert len(warning.data["rows"]) == 5 and set(warning.data["rows"]) <= set(codes.tolist())
