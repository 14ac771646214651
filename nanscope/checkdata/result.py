"""The result of a data scan, as plain data that serialises to `nanscope.data/1` JSON."""

from dataclasses import dataclass, field
from typing import Any

from nanscope.errors import EXIT_HEALTHY, EXIT_PROBLEM
from nanscope.checkdata.labels import LabelReport
from nanscope.jsonio import jsonable
from nanscope.rules.rule import Recommendation

SCHEMA = "nanscope.data/1"
PROBLEM_SEVERITIES = ("error", "warning")


@dataclass
class ColumnReport:
    """Statistics of one input feature or target column (the last axis of an array).

    Args:
        name: str. Column name ("x[3]", a csv header, a TFRecord feature).
        array: str. The array it belongs to ("x", "y", a feature name).
        values: int. Values scanned (rows x positions).
        positions: int. Values per row (pixels or time steps; 1 for tabular data).
        nan, posinf, neginf: int. Counts of NaN, +Inf, -Inf.
        min, max, mean, std: float. Over the finite values (NaN when there are none).
        zeros: float. Fraction of values that are exactly 0.
        first_nonfinite_rows: list of int. The first few rows holding a NaN/Inf.
        allowed_nonfinite: bool. The spec allows NaN here (`data.allow_nonfinite`): not a problem.
        constant: bool. All finite values are equal.
        scale: str or None. "large" or "small" when far from unit scale.
        ids: bool, default False. An input column that holds ids (an integer dtype): no scale is judged.
        median, robust_std: float or None. Robust location and scale (1.4826 x MAD) of a tabular float column,
            estimated from a thinned sample of its rows (None for ids, images, sequences, labels).
        max_robust_z: float or None. The largest robust z-score of any value: (max or min - median) / robust_std.
        outliers: int or None. Exact number of values over 10 robust std from the median.
        outlier_rows: list. The worst of them, worst first: [row, value, robust z].
        detached_rows: int or None. How many of them stand apart from the rest of the column (beyond a gap of
            10 robust std, `rules.outliers.detached`): glitches or missing-value codes, not a long tail.
        codes: list. The detached values that two or more rows share exactly, most rows first: [value, rows]
            (a missing-value code such as 9999).
        clean_mean, clean_std: float or None. The column's mean and std without its detached values; its scale
            is judged on these (None when nothing is detached).
        output: str, int or None. For a target column of a multi-output model, the output it
            belongs to: its name, or its position when the targets are listed in output order.
    """

    name: str
    array: str
    values: int
    positions: int
    nan: int
    posinf: int
    neginf: int
    min: float
    max: float
    mean: float
    std: float
    zeros: float
    first_nonfinite_rows: list[int]
    allowed_nonfinite: bool = False
    constant: bool = False
    scale: str | None = None
    output: str | int | None = None
    ids: bool = False
    median: float | None = None
    robust_std: float | None = None
    max_robust_z: float | None = None
    outliers: int | None = None
    outlier_rows: list[list[Any]] = field(default_factory=list)
    detached_rows: int | None = None
    codes: list[list[float]] = field(default_factory=list)
    clean_mean: float | None = None
    clean_std: float | None = None

    @property
    def nonfinite(self) -> int:
        """NaN + Inf count."""
        return self.nan + self.posinf + self.neginf

    @property
    def is_problem(self) -> bool:
        """True when this column holds non-finite values that the spec does not allow."""
        return self.nonfinite > 0 and not self.allowed_nonfinite


@dataclass
class DataScan:
    """Everything check-data learned about a dataset.

    Args:
        source: str. The spec or data file scanned.
        description: str. One line about the data.
        rows: int. Rows in the dataset (rows read, when sampled from a source of unknown length).
        scanned_rows: int. Rows whose values were scanned (`rows` unless sampled).
        inputs: list of ColumnReport. One per input feature/channel.
        targets: list of ColumnReport. One per target column.
        labels: LabelReport or None. The label check when exactly one target array was checked
            (the single-output case); see `label_checks` for all of them.
        recommendations: list of Recommendation. Rules that fired, with evidence.
        label_checks: list of LabelReport. One per target array whose output's loss is a
            classification loss, each naming its `output` (multi-output models) and `array`.
    """

    source: str
    description: str
    rows: int
    scanned_rows: int
    inputs: list[ColumnReport] = field(default_factory=list)
    targets: list[ColumnReport] = field(default_factory=list)
    labels: LabelReport | None = None
    recommendations: list[Recommendation] = field(default_factory=list)
    label_checks: list[LabelReport] = field(default_factory=list)

    @property
    def status(self) -> str:
        """"problems" when a rule fired at error or warning level, else "clean"."""
        return "problems" if any(r.severity in PROBLEM_SEVERITIES for r in self.recommendations) else "clean"

    @property
    def sampled(self) -> bool:
        """True when only a sample of the rows was scanned (`--sample`)."""
        return self.scanned_rows < self.rows

    def exit_code(self) -> int:
        """0 when clean, 1 when problems were found."""
        return EXIT_PROBLEM if self.status == "problems" else EXIT_HEALTHY

    def to_json(self) -> dict[str, Any]:
        """The `nanscope.data/1` document (NaN/Inf as strings)."""
        def column(c: ColumnReport) -> dict[str, Any]:
            entry = jsonable(c)
            entry["nonfinite"] = c.nonfinite
            return entry

        return {
            "schema": SCHEMA,
            "status": self.status,
            "source": self.source,
            "description": self.description,
            "rows": self.rows,
            "scanned_rows": self.scanned_rows,
            "sampled": self.sampled,
            "inputs": [column(c) for c in self.inputs],
            "targets": [column(c) for c in self.targets],
            "labels": jsonable(self.labels) if self.labels is not None else None,
            "recommendations": jsonable(self.recommendations),
            "label_checks": jsonable(self.label_checks),
        }
