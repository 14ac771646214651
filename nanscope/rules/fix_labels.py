"""`fix-labels`: labels outside what the loss expects. check-data finds it (`checkdata/findings.py`) and prints
`fix_for` the labels it checked."""

from nanscope.rules.rule import Fixtures, Rule

FIX_LABELS = Rule(
    "fix-labels",
    "Make the labels fit the loss",
    "Labels outside what the loss expects: sparse labels outside [0, classes), one-hot rows that do not "
    "sum to 1, binary targets outside [0, 1].",
    "Check the label encoding: sparse losses want integers in [0, classes), categorical ones one-hot rows, "
    "binary ones targets in [0, 1]",
)
RULES = (FIX_LABELS,)
# A check-data rule: its fixtures are data files in the realistic corpus's check-data tables (`CHECK_DATA_BUGGY`,
# `CHECK_DATA_HEALTHY` in tests/realistic/cases.py), scanned by `nanscope check-data`.
FIXTURES = Fixtures(fires=("churn-csv-unknown-label-minus-1",), quiet=("churn-csv-without-unknown-rows",))


def fix_for(kind: str, classes: int | None, bad_rows: int) -> str | None:
    """The snippet that keeps the rows whose label fits a `kind` ("sparse", "binary") loss, or None (the rule's).

    One-hot rows have no one repair (renormalise, or relabel from the source), so they keep the rule's text.

    Example:
        >>> print(fix_for("sparse", 2, 6))
        keep = ((y >= 0) & (y < 2) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)
        x, y = x[keep], y[keep]  # drops the 6 row(s) whose label does not fit the loss (or relabel them)
    """
    if kind == "sparse":
        test = "(y >= 0)" + (f" & (y < {classes})" if classes else "") + " & (y % 1 == 0)"
    elif kind == "binary":
        test = "(y >= 0) & (y <= 1)"
    else:
        return None
    return (f"keep = ({test}).reshape(len(y), -1).all(axis=1)\n"
            f"x, y = x[keep], y[keep]  # drops the {bad_rows} row(s) whose label does not fit the loss (or "
            "relabel them)")
