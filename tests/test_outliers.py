"""Glitch rows (a missing-value code among real targets): named with their step, rows and values; repaired,
not standardised; and the growth rules do not read a flat-then-spike loss as geometric growth."""

from pathlib import Path

import numpy as np
import pytest

from nanscope.model.factory import load_callable
from nanscope.rules.outliers import EXTREME_Z, glitch_rows
from nanscope.rules.trends import geometric_growth
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

DATA = Path(__file__).parent / "specs" / "scaled_data.py"
arrays = load_callable(f"{DATA}:arrays", DATA.parent, "test")
GLITCHES = (200, 205)
BATCH = 32


def trace(tmp_path, verify=False, **args):
    doc = {
        "model": {"factory": f"{DATA}:mlp"},
        "data": {"factory": f"{DATA}:arrays", "args": args, "batch_size": BATCH, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 12, "seed": 0},
    }
    return run_trace(parse_spec(doc, source=str(tmp_path / "spec.yaml")),
                     TraceOptions(trace_path=tmp_path / "t.jsonl", verify=verify))


def test_glitch_rows_are_named_with_their_step_and_values_and_repaired_not_standardised(tmp_path):
    _, y = arrays(glitch_rows=GLITCHES)
    clean = np.delete(y, GLITCHES, axis=0)
    assert y.std() > 10 * clean.std()  # the glitch alone makes the targets look badly scaled
    step = GLITCHES[0] // BATCH  # shuffle off: batch k holds rows k*32 onwards
    report = trace(tmp_path, verify=True, glitch_rows=GLITCHES)
    ids = [r.id for r in report.recommendations]
    assert "drop-outlier-rows" in ids[:2] and "normalize-targets" not in ids
    rec = report.recommendations[ids.index("drop-outlier-rows")]
    assert rec.data["step"] == step and rec.data["rows"] == list(GLITCHES)
    assert rec.data["values"]["y"] == {"200": [9999.0], "205": [9999.0]}
    assert rec.evidence[0].startswith(f"step {step}: ") and "200, 205" in rec.evidence[0]
    assert "9999" in rec.evidence[1] and "x[~bad]" in rec.fix
    assert rec.verified is True and rec.verification[0]["fix"] == "repair outlier rows"
    assert not any("from step 0" in line for r in report.recommendations for line in r.evidence)


def test_a_heavy_tail_or_clean_data_holds_no_glitch_rows():
    rng = np.random.default_rng(0)
    assert glitch_rows(rng.standard_normal((5000, 3)).astype(np.float32)) == {}
    tail = rng.lognormal(0.0, 2.0, size=(5000, 1)).astype(np.float32)  # many values far out: a tail, not glitches
    z = np.abs(tail - np.median(tail)) / (1.4826 * np.median(np.abs(tail - np.median(tail))))
    assert (z > EXTREME_Z).mean() > 0.01 and glitch_rows(tail) == {}


def test_growth_is_not_claimed_from_step_0_for_a_flat_loss_that_spikes():
    flat = [1.0 + 0.01 * np.sin(i) for i in range(30)] + [1e12, 1e30]
    found = geometric_growth(range(32), flat, 1.2, 4, 100.0)
    # Never the flat steps before it: the only fit that passes is the shortest one (4 steps) that ends at the
    # spike, from step 28 (1.0, 1.0, 1e12, 1e30); every earlier start fails the sustained-rise check.
    assert found is not None and found[1] == 28
    noisy = [*np.random.default_rng(0).uniform(0.5, 1.5, size=40).tolist(), 1e9]
    assert geometric_growth(range(41), noisy, 1.2, 4, 100.0) is None
    # An accelerating divergence is still growth from its start.
    accelerating = [450.0, 1122.0, 3264.0, 24432.0, 1.2e6, 1.15e11, 3.2e26]
    assert geometric_growth(range(7), accelerating, 1.2, 4, 100.0)[1] == 0
    rising = [1.0] * 10 + [3.0 ** i for i in range(1, 15)]
    rate, onset = geometric_growth(range(24), rising, 1.2, 4, 100.0)
    assert onset >= 5 and rate > 2.0


def test_a_growth_fit_over_a_long_run_reads_only_the_points_that_can_qualify(monkeypatch):
    """Starts further back than trends.fit_window cannot fit a steep enough line: the fits over the trailing
    window give every run's answer, and their memory does not grow with the run."""
    import tracemalloc

    from nanscope.rules import trends

    rng = np.random.default_rng(3)
    answers = {}
    for n in (5_000, 50_000):
        noise = (1 + 0.05 * rng.random(n)).astype(np.float32).astype(np.float64)
        rising = noise * np.r_[np.ones(n - 60), 1.3 ** np.arange(60)]
        tracemalloc.start()
        windowed = geometric_growth(np.arange(n), rising, 1.2, 4, 100.0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        with monkeypatch.context() as patch:
            patch.setattr(trends, "fit_window", lambda spread, rate_limit: None)
            everything = geometric_growth(np.arange(n), rising, 1.2, 4, 100.0)
        assert windowed[1] == everything[1] > n - 100 and windowed[0] == pytest.approx(everything[0], rel=1e-12)
        answers[n] = peak
    # The finite, positive copies of the input are all that grows (about 27 bytes a step), not the fits' dozen
    # arrays of every step (over 150 bytes a step).
    assert answers[50_000] - answers[5_000] < 40 * 45_000


def test_a_long_tail_holds_no_glitch_rows_and_only_a_shared_far_value_is_called_a_code():
    """Exponential and lognormal columns reach their far values through values in between: no glitches. A 9999
    in three rows stands apart and is shared: a missing-value code; one 9999 alone is a glitch, not a code."""
    from nanscope.rules.drop_outlier_rows import _fix

    rng = np.random.default_rng(5)
    tails = np.column_stack([rng.exponential(300.0, 5000), rng.lognormal(10.0, 0.6, 5000)]).astype(np.float32)
    z = np.abs(tails - np.median(tails, 0)) / (1.4826 * np.median(np.abs(tails - np.median(tails, 0)), 0))
    assert 0 < (z > EXTREME_Z).sum() < 0.01 * len(tails)  # a few far values, as glitches would be
    assert glitch_rows(tails) == {}
    coded = rng.normal(50.0, 10.0, (2000, 1)).astype(np.float32)
    coded[[10, 200, 1500]] = 9999.0
    found = glitch_rows(coded)
    assert sorted(found) == [10, 200, 1500]
    assert "x[0] = 9999 in 3 rows (a missing-value code?)" in _fix({"x": found})
    coded[[200, 1500]] = 50.0
    assert "missing-value code" not in _fix({"x": glitch_rows(coded)})
