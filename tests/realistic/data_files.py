"""The check-data part of the realistic corpus: the data files a user would scan before training.

Each factory writes a seeded csv table, as a churn export from a CRM would look: one row per
customer, a header, and a `churned` label. The buggy tables carry one planted data bug each
(`cases.CHECK_DATA_BUGGY`); their healthy twins (`cases.CHECK_DATA_HEALTHY`) are the same
table with the rule's printed fix applied, so nothing else differs.
"""

import csv
from pathlib import Path

import numpy as np

ROWS = 600
FEATURES = ("tenure_years", "monthly_charges_k", "support_calls", "usage_ratio")
# A UK-only export: the dialling code and the VAT rate are the same for every customer.
CONSTANT = {"country_code": 44.0, "vat_rate": 0.2}
# Rows of the label column that the CRM exported as -1, "outcome unknown" (customers still in their notice period).
UNKNOWN_ROWS = (17, 88, 251, 252, 430, 599)


def churn_features(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(features, churned): unit-scale features (years, thousands, counts, a ratio) and a label that follows them."""
    rng = np.random.default_rng(seed)
    tenure = rng.uniform(0.1, 6.0, ROWS)
    charges = rng.uniform(0.02, 0.12, ROWS)
    calls = rng.poisson(2.0, ROWS).astype(float)
    usage = rng.uniform(0.0, 1.0, ROWS)
    logit = 1.5 - 0.9 * tenure + 25.0 * charges + 0.6 * calls - 2.0 * usage
    churned = (rng.uniform(size=ROWS) < 1.0 / (1.0 + np.exp(-logit))).astype(float)
    return np.stack([tenure, charges, calls, usage], axis=1), churned


def _write(path: Path, columns: dict[str, np.ndarray]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(zip(*(np.round(values, 4).tolist() for values in columns.values())))
    return path


def churn_csv(path: Path, constant_columns: bool = False, unknown_labels: bool = False, known_rows_only: bool = False,
              seed: int = 0) -> Path:
    """Write the churn table to `path` (the target column is `churned`).

    Args:
        path: Path. The csv file to write.
        constant_columns: bool, default False. Add `country_code` and `vat_rate` after `support_calls`: one
            value in every row.
        unknown_labels: bool, default False. Write -1 in `churned` at UNKNOWN_ROWS.
        known_rows_only: bool, default False. Leave the rows UNKNOWN_ROWS out.
        seed: int, default 0. The table's seed.
    """
    x, churned = churn_features(seed)
    if unknown_labels:
        churned = churned.copy()
        churned[list(UNKNOWN_ROWS)] = -1.0
    columns = {name: x[:, i] for i, name in enumerate(FEATURES[:3])}
    if constant_columns:
        columns.update((name, np.full(ROWS, value)) for name, value in CONSTANT.items())
    columns[FEATURES[3]] = x[:, 3]
    columns["churned"] = churned
    if known_rows_only:
        columns = {name: np.delete(values, list(UNKNOWN_ROWS)) for name, values in columns.items()}
    return _write(Path(path), columns)


def read_csv(path: Path, target: str = "churned") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(x, y, feature names) of a table as a training script reads it: float32 features, float32 labels."""
    with open(path, newline="") as handle:
        header, *rows = list(csv.reader(handle))
    table = np.array(rows, dtype=np.float32)
    at = header.index(target)
    return np.delete(table, at, axis=1), table[:, at], [name for name in header if name != target]
