"""Label checks: do the targets fit what the loss expects?

The loss named in the run spec decides the check: a sparse categorical
cross-entropy wants one integer label per row in [0, classes); a categorical one
wants rows of class probabilities (one-hot) that sum to 1; a binary one wants
targets in [0, 1]. `LabelTally` streams over target chunks, counting labels per
class and the rows that break the expectation; the number of classes comes from a
hint (spec, command line or the model's output width), from the one-hot width, or stays unknown. A
multi-output model has one tally per target array, against its own output's loss.
"""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

MAX_COUNTED_CLASSES = 10_000
FIRST_ROWS_KEPT = 5
# Distinct integer labels outside [0, MAX_COUNTED_CLASSES) counted; more are not class labels.
MAX_OTHER_LABELS = 100
ONE_HOT_TOLERANCE = 1e-3

LABEL_KINDS = ("sparse", "onehot", "binary")
LOSS_KINDS = {
    "sparsecategoricalcrossentropy": "sparse",
    "sparsecategoricalfocalcrossentropy": "sparse",
    "categoricalcrossentropy": "onehot",
    "categoricalfocalcrossentropy": "onehot",
    "kldivergence": "onehot",
    "binarycrossentropy": "binary",
    "binaryfocalcrossentropy": "binary",
}
REGRESSION_LOSSES = {
    "mse", "mae", "mape", "msle", "meansquarederror", "meanabsoluteerror", "meanabsolutepercentageerror",
    "meansquaredlogarithmicerror", "huber", "logcosh", "poisson",
}


def label_kind(loss_name: str | None) -> str | None:
    """"sparse", "onehot", "binary", "regression", or None for a loss nanscope does not know."""
    if not loss_name:
        return None
    key = loss_name.lower().replace("_", "").replace("-", "")
    return LOSS_KINDS.get(key) or ("regression" if key in REGRESSION_LOSSES else None)


@dataclass
class LabelReport:
    """What the label check found, as plain data.

    Args:
        loss: str. The loss the labels were checked against.
        kind: str. "sparse", "onehot" or "binary".
        classes: int or None. The number of classes the check used.
        class_counts: dict. {label: rows} for the labels seen (integer labels, or one-hot argmax).
        bad_rows: int. Rows that break what the loss expects.
        first_bad_rows: list of int. The first few of them.
        problems: list of str. One line per kind of problem found.
        problem_rows: list of list of int. The first few rows of each problem, in the order of `problems`.
        output: str, int or None. The output of a multi-output model the labels belong to:
            its name, or its position when the targets are listed in output order.
        array: str or None. The target array checked.
    """

    loss: str
    kind: str
    classes: int | None
    class_counts: dict[int, int] = field(default_factory=dict)
    bad_rows: int = 0
    first_bad_rows: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem_rows: list[list[int]] = field(default_factory=list)
    output: str | int | None = None
    array: str | None = None


class LabelTally:
    """Streaming label check of one target array against a loss kind.

    Args:
        loss: str. The loss name, for the report.
        kind: str. "sparse", "onehot" or "binary" (from `label_kind`).
        classes: int or None. Expected number of classes, when known.
        output: str, int or None. The output the target array belongs to, for the report.
        array: str or None. The target array's name, for the report.
    """

    def __init__(self, loss: str, kind: str, classes: int | None = None, output: str | int | None = None,
                 array: str | None = None) -> None:
        self.report = LabelReport(loss, kind, classes, output=output, array=array)
        self._counts = np.zeros(0, np.int64)
        self._other_counts: Counter[float] = Counter()  # integer labels outside [0, MAX_COUNTED_CLASSES): -1, 99999
        self._issues: dict[str, int] = {}
        self._issue_rows: dict[str, list[int]] = {}
        self._row_ids = np.zeros(0, np.int64)

    def update(self, y: np.ndarray, row_ids: np.ndarray) -> None:
        """Check a chunk of targets; `row_ids` are the data rows of its rows."""
        y = np.asarray(y, dtype=np.float64)
        check = {"sparse": self._sparse, "onehot": self._onehot, "binary": self._binary}[self.report.kind]
        self._row_ids = np.asarray(row_ids)
        bad = check(y.reshape(len(y), -1))
        if bad is not None and bad.any():
            self.report.bad_rows += int(bad.sum())
            kept = self.report.first_bad_rows
            kept.extend(int(r) for r in row_ids[bad][: FIRST_ROWS_KEPT - len(kept)])

    def finish(self) -> LabelReport:
        """The LabelReport, with the count of every integer label seen and one line (and its rows) per problem."""
        report = self.report
        counts: dict[int, int] = {int(k): int(n) for k, n in enumerate(self._counts) if n}
        counts.update((int(k), int(n)) for k, n in self._other_counts.items())
        report.class_counts = dict(sorted(counts.items()))
        found = [issue for issue, n in self._issues.items() if n]
        report.problems = [f"{self._issues[issue]} row(s) {issue}" for issue in found]
        report.problem_rows = [self._issue_rows[issue] for issue in found]
        return report

    def _note(self, issue: str, mask: np.ndarray) -> np.ndarray:
        self._issues[issue] = self._issues.get(issue, 0) + int(mask.sum())
        kept = self._issue_rows.setdefault(issue, [])
        if len(kept) < FIRST_ROWS_KEPT and mask.any():
            kept.extend(int(r) for r in self._row_ids[mask][: FIRST_ROWS_KEPT - len(kept)])
        return mask

    def _count(self, labels: np.ndarray) -> None:
        labels = labels[labels == np.round(labels)]
        inside = (labels >= 0) & (labels < MAX_COUNTED_CLASSES)
        counts = np.bincount(labels[inside].astype(np.int64), minlength=len(self._counts))
        counts[: len(self._counts)] += self._counts
        self._counts = counts
        values, seen = np.unique(labels[~inside], return_counts=True)
        for value, n in zip(values.tolist(), seen.tolist()):
            if value in self._other_counts or len(self._other_counts) < MAX_OTHER_LABELS:
                self._other_counts[value] += n

    def _sparse(self, y: np.ndarray) -> np.ndarray:
        if y.shape[1] != 1:
            self._note(f"hold {y.shape[1]} values where a sparse cross-entropy wants one integer label "
                       "(one-hot targets want categorical_crossentropy)", np.ones(len(y), bool))
            return np.ones(len(y), bool)
        labels = y[:, 0]
        finite = np.isfinite(labels)
        fractional = self._note("hold a non-integer label", finite & (labels != np.round(labels)))
        negative = self._note("hold a negative label", finite & (labels < 0))
        classes = self.report.classes
        too_big = self._note(f"hold a label >= classes ({classes})", finite & (labels >= (classes or np.inf)))
        self._count(labels[finite & ~fractional])
        return fractional | negative | too_big

    def _onehot(self, y: np.ndarray) -> np.ndarray:
        if y.shape[1] == 1:
            return self._note("hold one value where a categorical cross-entropy wants one-hot rows "
                              "(integer labels want sparse_categorical_crossentropy)", np.ones(len(y), bool))
        classes = self.report.classes
        if classes is None:
            self.report.classes = classes = y.shape[1]
        if y.shape[1] != classes:
            return self._note(f"have width {y.shape[1]}, expected {classes} classes", np.ones(len(y), bool))
        finite = np.isfinite(y).all(axis=1)
        with np.errstate(invalid="ignore"):
            outside = self._note("hold a value outside [0, 1]", finite & ((y < 0) | (y > 1)).any(axis=1))
            off_sum = self._note("do not sum to 1", finite & (np.abs(y.sum(axis=1) - 1) > ONE_HOT_TOLERANCE))
        if y.shape[1] > 0:
            self._count(np.argmax(y[finite], axis=1))
        return outside | off_sum

    def _binary(self, y: np.ndarray) -> np.ndarray:
        finite = np.isfinite(y)
        with np.errstate(invalid="ignore"):
            outside = self._note("hold a target outside [0, 1]", (finite & ((y < 0) | (y > 1))).any(axis=1))
        self._count(y[finite])  # every integer target is counted, a -1 of a {-1, 1} encoding too
        return outside
