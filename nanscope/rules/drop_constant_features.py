"""`drop-constant-features`: input features with one value in every row. check-data finds it
(`checkdata/findings.py`) and prints `fix_for` of the columns it found."""

from nanscope.rules.rule import Fixtures, Rule

DROP_CONSTANT_FEATURES = Rule(
    "drop-constant-features",
    "Drop the constant features",
    "Input features with the same value in every row.",
    # max > min, not std > 0: a float32 column of 0.2 in every row has a std of about 1e-6 (rounding in the mean),
    # and a column with a missing value has a std of NaN; nanmax/nanmin compare the values themselves.
    "x = x[:, np.nanmax(x, axis=0) > np.nanmin(x, axis=0)]  # a constant feature carries no signal and divides "
    "by 0 when standardised",
)
RULES = (DROP_CONSTANT_FEATURES,)
# A check-data rule: its fixtures are data files in the realistic corpus's check-data tables (`CHECK_DATA_BUGGY`,
# `CHECK_DATA_HEALTHY` in tests/realistic/cases.py), scanned by `nanscope check-data`.
FIXTURES = Fixtures(fires=("churn-csv-constant-country-and-vat",), quiet=("churn-csv",))


def fix_for(array: str, indices: list[int], names: list[str]) -> str:
    """The line that drops the constant columns `indices` (named `names`) of the input array `array` ("x").

    Example:
        >>> fix_for("x", [3, 4], ["country_code", "vat_rate"])
        'x = np.delete(x, [3, 4], axis=-1)  # country_code, vat_rate: one value in every row'
    """
    return f"{array} = np.delete({array}, {indices}, axis=-1)  # {', '.join(names)}: one value in every row"
