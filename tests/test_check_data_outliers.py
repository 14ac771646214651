"""check-data's robust z-score per column: median and MAD, an exact count and the worst rows.

The reference is numpy on the whole array: np.median, the MAD, |x - median| / (1.4826 MAD).
"""

import numpy as np

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
