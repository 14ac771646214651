"""`drop-constant-features`: input features with one value in every row. check-data finds it
(`checkdata/findings.py`)."""

from nanscope.rules.rule import Fixtures, Rule

DROP_CONSTANT_FEATURES = Rule(
    "drop-constant-features",
    "Drop the constant features",
    "Input features with the same value in every row.",
    "x = x[:, x.std(axis=0) > 0]  # a constant feature carries no signal and divides by 0 when standardised",
)
RULES = (DROP_CONSTANT_FEATURES,)
# A check-data rule: its fixtures are check-data's (tests/test_check_data.py), not trace-steps' corpus.
FIXTURES = Fixtures(fires=(), quiet=())
