"""`clean-input-data`: NaN or Inf in the batch itself (phase `data`)."""

from typing import Any

import numpy as np

from nanscope.rules.facts import Facts
from nanscope.rules.fixes import Bundle, StepFix
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule
from nanscope.runtime import tensorflow

CLEAN_INPUT_DATA = Rule(
    "clean-input-data",
    "Remove or impute the non-finite values in the input data",
    "NaN or Inf values in the batch fed to the model (phase `data`).",
    "x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # or drop the rows: x[np.isfinite(x).all(axis=1)]",
)
RULES = (CLEAN_INPUT_DATA,)
FIXTURES = Fixtures(fires=("nan-feature-row",), quiet=("tabular-regression-adam",))


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs: the first non-finite value was in the batch."""
    first = facts.first
    if first is None or first.phase != "data":
        return []
    evidence = [f"step {first.step}: the batch itself holds non-finite values", *list(first.detail)]
    return [(1.0, CLEAN_INPUT_DATA.recommend("error", evidence, data={"step": first.step}))]


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved batch without its rows that hold a non-finite value (none when every row or no row does)."""
    del rec, run  # Unused
    tf, _ = tensorflow()
    leaves = [np.asarray(t) for t in tf.nest.flatten(bundle.batch) if t is not None]
    rows = len(leaves[0]) if leaves and leaves[0].ndim else 0
    bad = np.zeros(rows, bool)
    for leaf in leaves:
        if np.issubdtype(leaf.dtype, np.floating) and leaf.ndim and len(leaf) == rows:
            bad |= ~np.isfinite(leaf.reshape(rows, -1)).all(axis=1)
    if not bad.any() or bad.all():
        return []
    keep = np.flatnonzero(~bad)
    batch = tf.nest.map_structure(lambda t: tf.gather(t, keep) if t is not None else None, bundle.batch)
    return [StepFix(f"drop {int(bad.sum())} non-finite rows", {"dropped_rows": np.flatnonzero(bad).tolist()},
                    acts_on="step", batch=batch)]
