"""Readers of data files (.npz, .npy, .csv, .tfrecord), shared by training and check-data.

Each reader yields its arrays a block of rows at a time: an .npy file is
memory-mapped, an .npz member is read from the zip archive piece by piece
(compressed or not), a csv file is parsed a block of lines at a time and a TFRecord
file a batch of records at a time. check-data streams over the blocks, holding one
at a time; training (`data/sources.py`) reads a file whole by joining them (`whole`).
Every problem is a DataError naming `origin` (the spec or the data file), the field
and the file. TensorFlow is imported only for TFRecord files.
"""

import csv
import itertools
import os
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from nanscope.errors import DataError, first_line

TFRECORD_DTYPES = ("float32", "float64", "int64")

# An npy header: (shape, Fortran order, dtype).
Header = tuple[tuple[int, ...], bool, np.dtype]


def whole(blocks: Iterable[dict[str, Any]]) -> dict[str, np.ndarray]:
    """{name: array} of all rows, joined from the {name: array} blocks of a reader; {} when there are none."""
    parts: dict[str, list[np.ndarray]] = {}
    for block in blocks:
        for name, array in block.items():
            parts.setdefault(name, []).append(np.asarray(array))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


# --- npz ----------------------------------------------------------------------------------------------------


class NpzFile:
    """An .npz archive opened for reading its members a block of rows at a time.

    Args:
        path: Path. The archive.
        origin: str. The file to name in error messages.
    """

    def __init__(self, path: Path, origin: str | None) -> None:
        self.path, self.origin = path, origin
        try:
            self.archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise self._error(exc) from exc
        self.keys = [n.removesuffix(".npy") for n in self.archive.namelist()]
        self._headers: dict[str, Header] = {}

    def check(self, field_name: str, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """Raise naming `field_name` when the archive has no member `key`; else its (shape, dtype)."""
        if key not in self.keys:
            raise DataError(f"{self.origin}: {field_name}: {self.path.name} has no array {key!r}; it holds {self.keys}")
        if key not in self._headers:
            self._headers[key] = self._header(key)
        shape, _, dtype = self._headers[key]
        return shape, dtype

    def row_bytes(self, key: str) -> int:
        shape, _, dtype = self._headers[key]
        return int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def close(self) -> None:
        self.archive.close()

    def __enter__(self) -> "NpzFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, key: str) -> np.ndarray:
        """The whole member `key` (checked first), as one array."""
        try:
            with self.archive.open(key + ".npy") as handle:
                return np.lib.format.read_array(handle, allow_pickle=False)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # a corrupt or truncated member
            raise self._error(exc) from exc

    def blocks(self, keys: Sequence[str], rows: int, size: int) -> Iterator[dict[str, np.ndarray]]:
        """Yield {key: array} blocks of at most `size` rows of the members `keys` (checked first), `rows` in all."""
        handles: dict[str, IO[bytes]] = {}
        loaded: dict[str, np.ndarray] = {}
        try:
            for key in keys:
                handles[key] = self.archive.open(key + ".npy")
                if self._headers[key][1]:  # Fortran order: rows are not contiguous, so the member is read whole
                    loaded[key] = np.lib.format.read_array(handles[key], allow_pickle=False)
                else:
                    _read_header(handles[key])
            for start in range(0, rows, size):
                n = min(size, rows - start)
                yield {key: loaded[key][start:start + n] if key in loaded else self._read_rows(handles[key], key, n)
                       for key in keys}
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # a corrupt or truncated member
            raise self._error(exc) from exc
        finally:
            for handle in handles.values():
                handle.close()

    def _header(self, key: str) -> Header:
        try:
            with self.archive.open(key + ".npy") as handle:
                shape, fortran, dtype = _read_header(handle)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise self._error(exc) from exc
        if dtype.hasobject:  # as np.load(allow_pickle=False) says it
            raise self._error(ValueError("Object arrays cannot be loaded when allow_pickle=False"))
        return shape, fortran, dtype

    def _read_rows(self, handle: IO[bytes], key: str, n: int) -> np.ndarray:
        shape, _, dtype = self._headers[key]
        buffer = handle.read(n * self.row_bytes(key))
        if len(buffer) != n * self.row_bytes(key):
            raise self._error(EOFError(f"member {key!r} is truncated"))
        return np.frombuffer(buffer, dtype=dtype).reshape(n, *shape[1:])

    def _error(self, exc: BaseException) -> DataError:
        return DataError(f"{self.origin}: data.path: cannot read {self.path} as npz: {first_line(exc)}")


def _read_header(handle: IO[bytes]) -> Header:
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(handle)
    return np.lib.format.read_array_header_2_0(handle)


# --- npy ----------------------------------------------------------------------------------------------------


def load_npy(path: Path, origin: str | None, field_name: str) -> np.ndarray:
    """A memory-mapped .npy array of numbers (nothing is read until it is sliced)."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a file that is not an npy array
        raise DataError(f"{origin}: {field_name}: cannot read {path} as npy: {first_line(exc)}") from exc
    if array.dtype.hasobject or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise DataError(f"{origin}: {field_name}: {path.name} must hold numbers. Received dtype {array.dtype}")
    return array


# --- csv ----------------------------------------------------------------------------------------------------


def csv_header(path: Path, origin: str | None) -> list[str]:
    """The stripped column names of a csv file's first line."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            first = handle.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise _csv_error(path, origin, exc) from exc
    header = [h.strip() for h in next(csv.reader([first]))] if first.strip() else []
    if not header:
        raise DataError(f"{origin}: data.path: {path.name} is empty (no header line)")
    return header


def csv_columns(names: str | Iterable[str]) -> list[str]:
    """The column names `data.target` gives for one target: one name or a list of them."""
    return [names] if isinstance(names, str) else list(names)


def csv_blocks(path: Path, header: list[str], origin: str | None, size: int) -> Iterator[np.ndarray]:
    """Yield float64 [rows, len(header)] tables of at most `size` data lines each; blank lines are skipped.

    An empty cell is NaN; a cell that is not a number, or a line with the wrong number
    of cells, is a DataError naming the line (and the column).
    """
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            next(handle)
            line_number = 2
            while True:
                lines = list(itertools.islice(handle, size))
                if not lines:
                    return
                yield _parse_lines(lines, header, path, line_number)
                line_number += len(lines)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _csv_error(path, origin, exc) from exc


def _csv_error(path: str | os.PathLike[str], origin: str | None, exc: BaseException) -> DataError:
    return DataError(f"{origin}: data.path: cannot read {path} as a UTF-8 csv: {first_line(exc)}")


def _parse_lines(lines: list[str], header: list[str], path: Path, first_line_number: int) -> np.ndarray:
    numbered = [(first_line_number + i, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        return np.zeros((0, len(header)), np.float64)
    try:
        table = np.loadtxt([line for _, line in numbered], delimiter=",", quotechar='"', dtype=np.float64, ndmin=2)
    except ValueError:
        table = np.array([_parse_row(line, header, path, number) for number, line in numbered])
    if table.shape[1] != len(header):
        raise DataError(f"{path}: line {numbered[0][0]}: {table.shape[1]} cells, expected {len(header)}")
    return table


def _parse_row(line: str, header: list[str], path: Path, number: int) -> list[float]:
    cells = next(csv.reader([line.rstrip("\r\n")]))
    if len(cells) != len(header):
        raise DataError(f"{path}: line {number}: {len(cells)} cells, expected {len(header)}")
    row: list[float] = []
    for name, cell in zip(header, cells):
        try:
            row.append(float(cell) if cell.strip() else np.nan)
        except ValueError:
            raise DataError(f"{path}: line {number}, column {name!r}: not a number: {cell!r}") from None
    return row


# --- TFRecord -----------------------------------------------------------------------------------------------


def tfrecord_blocks(path: Path, features: Mapping[str, tuple[str, Sequence[int]]], origin: str | None,
                    size: int) -> Iterator[dict[str, np.ndarray]]:
    """Yield {feature: array} blocks of at most `size` tf.train.Example records, parsed with `features`.

    Args:
        features: dict of name -> (dtype, shape). dtype is one of TFRECORD_DTYPES.
    """
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    parse_spec = {name: tf.io.FixedLenFeature(list(shape), getattr(tf, dtype))
                  for name, (dtype, shape) in features.items()}
    try:
        for records in tf.data.TFRecordDataset(str(path)).batch(size):
            parsed = tf.io.parse_example(records, parse_spec)
            yield {name: parsed[name].numpy() for name in features}
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as exc:
        message = str(exc.message).strip().splitlines()[0]
        raise DataError(f"{origin}: data.features: {path.name} does not match the feature spec: {message}") from None
