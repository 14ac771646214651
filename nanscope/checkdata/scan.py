"""`scan_data`: the one entry point of check-data.

Opens the data a run spec (or a data file given directly) names, streams it in
chunks through per-column statistics and the label checks (one per target array,
against the loss of its output), and returns a `DataScan`. Exact over all rows
unless `sample` asks for a uniform sample.

Example:
    scan = scan_data("my-run.yaml")
    scan.status, scan.exit_code()
"""

import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from nanscope.checkdata.sampling import Sampler, sampled_chunks
from nanscope.checkdata.findings import column_scale, recommendations
from nanscope.checkdata.labels import LABEL_KINDS, LabelTally, label_kind
from nanscope.checkdata.model_width import output_widths
from nanscope.checkdata.outputs import output_losses
from nanscope.checkdata.readers import FILE_READERS, open_stream
from nanscope.checkdata.result import ColumnReport, DataScan
from nanscope.checkdata.robust import OutlierCount, RowSample, largest_z
from nanscope.checkdata.stats import ColumnStats
from nanscope.rules.outliers import EXTREME_Z, MAX_FRACTION, missing_value_codes
from nanscope.data.inputs import id_inputs
from nanscope.errors import DataError, SpecError
from nanscope.spec.load import load_spec
from nanscope.checkdata.stream import Chunk, DataStream
from nanscope.spec.sections import DataSpec, RunSpec


CLASS_HINTS = ("classes", "num_classes", "n_classes")
# Loss kinds whose label check needs the number of classes.
CLASS_KINDS = ("sparse", "onehot")

# The number of classes: one for every output, or {output name: classes} (None: the width is not known).
ClassesHint = int | dict[Any, int | None]
# {array: (median, robust std, the suspect columns)}
Suspects = dict[str, tuple[np.ndarray, np.ndarray, list[int]]]


def scan_data(source: str | os.PathLike, target: str | None = None, loss: str | None = None,
              classes: int | None = None, sample: int | None = None, chunk_rows: int | None = None,
              on_progress: Callable[..., None] | None = None) -> DataScan:
    """Scan a dataset for NaN/Inf, scale and label problems.

    Args:
        source: str or Path. A YAML run spec (its data section is scanned) or a data file.
        target: str, optional. The target column of a csv / feature of a TFRecord file given directly.
        loss: str, optional. Loss name the labels of every target array are checked against (default:
            the spec's `train.loss`, per output for a multi-output model).
        classes: int, optional. Number of classes (default: from the spec, when it says; per output
            when a factory's `classes` argument is a mapping from output name).
        sample: int, optional. Scan a uniform random sample of this many rows instead of all.
        chunk_rows: int, optional. Rows per chunk (default: about 4 MB per chunk, to stay in cache).
        on_progress: callable(rows_done, rows_total or None), optional. Called after each chunk.

    Returns:
        DataScan.

    Raises:
        SpecError, DataError: bad input, naming the file and field.
    """
    path = Path(source)
    stream, settings = _open(path, target, loss, classes)
    sampler = Sampler(sample, stream.rows)
    arrays = _ArrayScans(stream)
    tallies = {
        name: LabelTally(s.loss, s.kind, s.classes, output=stream.outputs.get(name), array=name)
        for name, s in settings.items() if s.kind in LABEL_KINDS and s.loss is not None  # a known kind has a loss
    }
    rows = 0
    for chunk, chosen, start, rows in sampled_chunks(stream, sampler, chunk_rows):
        picked = {name: a[chosen - start] if sampler.active else a for name, a in chunk.items()}
        arrays.update(picked, chosen)
        for name, tally in tallies.items():
            tally.update(picked[name], chosen)
        if on_progress is not None:
            on_progress(rows, stream.rows)
    if rows == 0:
        raise DataError(f"{stream.origin}: {stream.field}: the dataset is empty (0 rows)")
    regression = {
        name for name, s in settings.items()
        if s.kind == "regression" or (s.kind is None and not arrays.integer_targets([name]))
    }
    ids = arrays.id_arrays(stream.inputs)
    suspects = arrays.outlier_suspects([n for n in stream.inputs if n not in ids] + sorted(regression))
    if suspects:  # a second pass over the data, only for the columns that may hold glitches
        arrays.outliers = _count_outliers(path, target, loss, classes, sample, chunk_rows, suspects)
    inputs, targets = arrays.reports(stream.inputs, ids=ids), arrays.reports(stream.targets)
    label_checks = [tally.finish() for tally in tallies.values()]
    found = recommendations(inputs, targets, label_checks, regression)
    scanned = sampler.scanned if sampler.active else rows
    labels = label_checks[0] if len(label_checks) == 1 else None
    return DataScan(str(path), stream.description, rows, scanned, inputs, targets, labels, found, label_checks)


def _count_outliers(path: Path, target: str | None, loss: str | None, classes: int | None, sample: int | None,
                    chunk_rows: int | None, suspects: Suspects) -> dict[str, OutlierCount]:
    """{array: OutlierCount} from a second pass over the same rows, for the suspect columns only."""
    stream, _ = _open(path, target, loss, classes)
    sampler = Sampler(sample, stream.rows)
    counts = {name: OutlierCount(columns, median, scale) for name, (median, scale, columns) in suspects.items()}
    for chunk, chosen, start, _ in sampled_chunks(stream, sampler, chunk_rows):
        for name, count in counts.items():
            array = np.asarray(chunk[name])
            array = array[chosen - start] if sampler.active else array
            count.update(array.reshape(len(array), -1), chosen)
    return counts


class _LabelSettings(NamedTuple):
    """What one target array's labels are checked against: its output's loss, the loss kind, the classes."""

    loss: str | None
    kind: str | None
    classes: int | None


def _open(path: Path, target: str | None, loss: str | None, classes: int | None
          ) -> tuple[DataStream, dict[str, "_LabelSettings"]]:
    """(DataStream, {target array: _LabelSettings}) for a spec or a data file."""
    if path.suffix.lower() in (".yaml", ".yml"):
        spec = load_spec(path)
        data = spec.data if target is None else spec.data.model_copy(update={"target": target})
        stream = open_stream(data, spec.base_dir, str(path))
        stream.allow_nonfinite = set(data.allow_nonfinite)
        outputs = [stream.outputs.get(name) for name in stream.targets]
        losses = [loss] * len(outputs) if loss else output_losses(spec.train.loss, outputs, str(path))
        hint: ClassesHint | None = classes or _classes_hint(spec)
        if hint is None and any(label_kind(name) in CLASS_KINDS for name in losses):
            widths = output_widths(spec)
            hint = widths.get(None, widths)
        return stream, {
            name: _LabelSettings(loss_name, label_kind(loss_name), _classes_for(hint, output))
            for name, output, loss_name in zip(stream.targets, outputs, losses)
        }
    if path.suffix.lower() not in FILE_READERS:
        raise SpecError(f"{path}: expected a YAML run spec (.yaml) or a data file (.npz, .npy, .csv, .tfrecord)")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    data = DataSpec(path=str(path.resolve()), target=target)
    stream = open_stream(data, path.parent, str(path), require_targets=False)
    return stream, {name: _LabelSettings(loss, label_kind(loss), classes) for name in stream.targets}


def _classes_hint(spec: RunSpec) -> ClassesHint | None:
    """The number of classes the spec states: an int, or a mapping from output name to int."""
    synthetic = spec.data.synthetic
    if synthetic is not None and synthetic.kind == "classification":
        return synthetic.classes
    for key in CLASS_HINTS:
        for args in (spec.data.args, spec.model.args):
            hint = args.get(key)
            if isinstance(hint, int) or (isinstance(hint, dict) and all(isinstance(v, int) for v in hint.values())):
                return hint
    return None


def _classes_for(hint: ClassesHint | None, output: str | int | None) -> int | None:
    """The classes of one output from a hint: one number for every output, or its entry in a mapping."""
    if isinstance(hint, dict):
        return hint.get(output) if isinstance(output, str) else None
    return hint


class _ArrayScans:
    """A ColumnStats per array, created from the first chunk's shapes."""

    def __init__(self, stream: DataStream) -> None:
        self.stream = stream
        self.stats: dict[str, ColumnStats] = {}
        self.positions: dict[str, int] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.samples: dict[str, RowSample] = {}
        self.robust: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (median, robust std, largest z)
        self.outliers: dict[str, OutlierCount] = {}

    def update(self, chunk: Chunk, row_ids: np.ndarray) -> None:
        for name, array in chunk.items():
            array = np.asarray(array)
            if name not in self.stats:
                columns = array.shape[-1] if array.ndim > 1 else 1
                self.stats[name] = ColumnStats(columns)
                self.positions[name] = int(np.prod(array.shape[1:-1], dtype=np.int64)) if array.ndim > 2 else 1
                self.dtypes[name] = array.dtype
            columns = self.stats[name].columns
            self.stats[name].update(array.reshape(-1, columns), row_ids, self.positions[name])
            if self.positions[name] == 1 and np.issubdtype(array.dtype, np.floating):  # tabular float columns
                self.samples.setdefault(name, RowSample(self.stream.rows)).update(array.reshape(-1, columns), row_ids)

    def outlier_suspects(self, names: list[str]) -> Suspects:
        """{array: (median, robust std, columns whose min or max lies over EXTREME_Z robust std out)}."""
        suspects: Suspects = {}
        for name in names:
            if name not in self.samples:
                continue
            s = self.stats[name]
            median, scale = self.samples[name].scale()
            self.robust[name] = (median, scale, largest_z(median, scale, s.finite_min(), s.finite_max()))
            columns = np.flatnonzero(self.robust[name][2] > EXTREME_Z).tolist()
            if columns:
                suspects[name] = (median, scale, columns)
        return suspects

    def integer_targets(self, names: list[str]) -> bool:
        return bool(names) and all(np.issubdtype(self.dtypes[n], np.integer) for n in names if n in self.dtypes)

    def id_arrays(self, names: list[str]) -> set[str]:
        """The input arrays that hold ids (integer token or category ids): they have no scale to judge."""
        return id_inputs([(n, self.dtypes[n]) for n in names if n in self.dtypes])

    def reports(self, names: list[str], ids: Collection[str] = ()) -> list[ColumnReport]:
        return [report for name in names if name in self.stats for report in self._column_reports(name, name in ids)]

    def _column_reports(self, name: str, ids: bool = False) -> list[ColumnReport]:
        s = self.stats[name]
        mean, std, low, high = s.finite_mean(), s.std(), s.finite_min(), s.finite_max()
        values = s.count + s.nan + s.posinf + s.neginf
        names = self._column_names(name, s.columns)
        allowed = self.stream.allow_nonfinite
        output = self.stream.outputs.get(name)
        aliases = {name} if output is None else {name, str(output)}
        robust = [self._robust_fields(name, i) for i in range(s.columns)]
        # The scale is judged without the detached values (glitches, missing-value codes): they are not the data.
        judged_mean = np.array([m if r.get("clean_mean") is None else r["clean_mean"] for r, m in zip(robust, mean)])
        judged_std = np.array([d if r.get("clean_std") is None else r["clean_std"] for r, d in zip(robust, std)])
        scales = [None] * s.columns if ids else column_scale(judged_mean, judged_std, s.count)
        return [
            ColumnReport(
                names[i], name, int(values[i]), self.positions[name], int(s.nan[i]), int(s.posinf[i]),
                int(s.neginf[i]), float(low[i]), float(high[i]), float(mean[i]), float(std[i]),
                float(s.zeros[i] / max(values[i], 1)), list(s.first_nonfinite_rows[i]),
                allowed_nonfinite=bool(({names[i]} | aliases) & allowed),
                constant=bool(s.count[i] > 1 and low[i] == high[i]), scale=scales[i], output=output, ids=ids,
                **robust[i],
            )
            for i in range(s.columns)
        ]

    def _robust_fields(self, name: str, column: int) -> dict[str, Any]:
        if name not in self.robust:
            return {}
        median, scale, largest = (float(v[column]) for v in self.robust[name])
        counted = self.outliers[name].results().get(column) if name in self.outliers else None
        count, worst, apart, (clean_mean, clean_std) = counted if counted is not None else (0, [], {}, (None, None))
        s = self.stats[name]
        values = int(s.count[column] + s.nan[column] + s.posinf[column] + s.neginf[column])
        if not missing_value_codes(apart) and count > MAX_FRACTION * values:
            # Many values far out are a heavy tail, whose farthest can stand apart too: they are the data.
            apart, clean_mean, clean_std = {}, None, None
        return {"median": median, "robust_std": scale, "max_robust_z": largest, "outliers": count,
                "outlier_rows": [list(item) for item in worst], "detached_rows": int(sum(apart.values())),
                "codes": [[value, rows] for value, rows in sorted(missing_value_codes(apart).items(),
                                                                  key=lambda item: -item[1])],
                "clean_mean": clean_mean, "clean_std": clean_std}

    def _column_names(self, name: str, columns: int) -> list[str]:
        given = self.stream.column_names.get(name)
        if given and len(given) == columns:
            return list(given)
        if columns == 1 and self.positions[name] == 1:
            return [name]
        return [f"{name}[..., {i}]" if self.positions[name] > 1 else f"{name}[{i}]" for i in range(columns)]
