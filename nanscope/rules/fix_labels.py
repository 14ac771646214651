"""`fix-labels`: labels outside what the loss expects. check-data finds it (`checkdata/findings.py`)."""

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
# A check-data rule: its fixtures are check-data's (tests/test_check_data.py), not trace-steps' corpus.
FIXTURES = Fixtures(fires=(), quiet=())
