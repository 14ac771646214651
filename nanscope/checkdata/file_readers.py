"""Chunked readers for numpy and csv files: bounded memory however large the file.

An .npy file is memory-mapped; an .npz member is read from the zip archive piece by
piece (compressed or not); a csv file is parsed a block of lines at a time. A
multi-output model's targets are one array per output, each read the same way.
"""

import csv
import itertools
import zipfile
from pathlib import Path

import numpy as np

from nanscope.checkdata.outputs import array_names, spec_parts
from nanscope.checkdata.stream import DataStream, check_rows, outputs_of
from nanscope.errors import DataError


def open_npz(data, path, base_dir, origin, require_targets=True):
    """A DataStream over the `data.x` member of an .npz archive and the `data.y` member(s), one per output."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{origin}: data.path: cannot read {path} as npz: {exc}") from exc
    keys = [n.removesuffix(".npy") for n in archive.namelist()]
    parts = spec_parts(data.y, "data.y")
    members = {}
    for field_name, key in (("data.x", data.x), *((part.field, part.source) for part in parts)):
        if key not in keys:
            raise DataError(f"{origin}: {field_name}: {path.name} has no array {key!r}; it holds {keys}")
        if key not in members:
            members[key] = _member_header(archive, key, path, origin, field_name)
    targets = array_names(parts, [data.x], lambda part: part.source)
    sources = {data.x: data.x, **{name: part.source for name, part in targets.items()}}
    rows = check_rows({name: members[key][0] for name, key in sources.items()}, origin, "data.path")

    def chunks(size):
        handles = {key: archive.open(key + ".npy") for key in members}
        try:
            for handle in handles.values():
                _skip_header(handle)
            for start in range(0, rows, size):
                n = min(size, rows - start)
                read = {key: _read_rows(handles[key], members[key], n) for key in members}
                yield {name: read[key] for name, key in sources.items()}
        finally:
            for handle in handles.values():
                handle.close()

    row_bytes = sum(member[2] for member in members.values())
    return DataStream(f"{path.name}, {rows} rows", [data.x], list(targets), rows, chunks, origin=origin,
                      row_bytes=row_bytes, outputs=outputs_of(targets))


def _member_header(archive, key, path, origin, field_name):
    with archive.open(key + ".npy") as handle:
        shape, fortran, dtype = _skip_header(handle)
    if fortran or dtype.hasobject:
        raise DataError(f"{origin}: {field_name}: {path.name}[{key!r}] must be a C-ordered numeric array")
    return shape, dtype, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize


def _skip_header(handle):
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(handle)
    return np.lib.format.read_array_header_2_0(handle)


def _read_rows(handle, member, n):
    shape, dtype, row_bytes = member
    buffer = handle.read(n * row_bytes)
    return np.frombuffer(buffer, dtype=dtype).reshape(n, *shape[1:])


def open_npy(data, path, base_dir, origin, require_targets=True):
    """A DataStream over a memory-mapped .npy file of inputs and, from `data.y`, one of targets per output."""
    x = _memmap(path, origin, "data.path")
    parts = spec_parts(data.y, "data.y")
    targets = array_names(parts, ["x"], lambda part: "y" if part.output is None else Path(part.source).stem)
    arrays, files = {"x": x}, []
    for name, part in targets.items():
        y_path = Path(part.source).expanduser()
        y_path = y_path if y_path.is_absolute() else Path(base_dir) / y_path
        if y_path.is_file():
            arrays[name] = _memmap(y_path, origin, part.field)
            files.append(y_path.name)
        elif require_targets or part.output is not None:
            raise DataError(
                f"{origin}: {part.field}: for an .npy input, `y` names the targets' .npy file; not found: {y_path}")
    rows = check_rows({name: a.shape for name, a in arrays.items()}, origin, "data.path")

    def chunks(size):
        for start in range(0, rows, size):
            yield {name: a[start : start + size] for name, a in arrays.items()}

    described = " + ".join([path.name, *files]) + f", {rows} rows"
    row_bytes = sum(a[:1].nbytes for a in arrays.values())
    targets = {name: part for name, part in targets.items() if name in arrays}
    return DataStream(described, ["x"], list(targets), rows, chunks, origin=origin, row_bytes=row_bytes,
                      outputs=outputs_of(targets))


def _memmap(path, origin, field_name):
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:
        raise DataError(f"{origin}: {field_name}: cannot read {path} as npy: {exc}") from exc
    if array.dtype.hasobject or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise DataError(f"{origin}: {field_name}: {path.name} must hold numbers. Received dtype {array.dtype}")
    return array


def open_csv(data, path, base_dir, origin, require_targets=True):
    """A DataStream over a csv file with a header; `data.target` names the target column(s), per output or not."""
    header = _csv_header(path, origin)
    parts = [part for part in spec_parts(data.target, "data.target", list_is_one_target=True) if part.source]
    if not parts and require_targets:
        raise DataError(f"{origin}: data.target: a csv source needs `target:` naming the target column(s)")
    for part in parts:
        missing = [t for t in _columns(part) if t not in header]
        if missing:
            raise DataError(f"{origin}: {part.field}: column(s) {missing} not in {path.name}; columns are {header}")
    targets = array_names(parts, ["inputs"], lambda part: "targets")
    target_idx = {name: [header.index(c) for c in _columns(part)] for name, part in targets.items()}
    taken = {i for idx in target_idx.values() for i in idx}
    feature_idx = [i for i in range(len(header)) if i not in taken]

    def chunks(size):
        with open(path, newline="", encoding="utf-8") as handle:
            next(handle)
            line_number = 2
            while True:
                lines = list(itertools.islice(handle, size))
                if not lines:
                    return
                table = _parse_lines(lines, header, path, line_number)
                line_number += len(lines)
                yield {"inputs": table[:, feature_idx], **{name: table[:, idx] for name, idx in target_idx.items()}}

    names = {"inputs": [header[i] for i in feature_idx], **{name: _columns(part) for name, part in targets.items()}}
    return DataStream(path.name, ["inputs"], list(targets), None, chunks, column_names=names, origin=origin,
                      outputs=outputs_of(targets))


def _columns(part):
    return [part.source] if isinstance(part.source, str) else list(part.source)


def _csv_header(path, origin):
    with open(path, newline="", encoding="utf-8") as handle:
        first = handle.readline()
    header = [h.strip() for h in next(csv.reader([first]))] if first.strip() else []
    if not header:
        raise DataError(f"{origin}: data.path: {path.name} is empty (no header line)")
    return header


def _parse_lines(lines, header, path, first_line):
    lines = [line for line in lines if line.strip()]
    if not lines:
        return np.zeros((0, len(header)), np.float64)
    try:
        table = np.loadtxt(lines, delimiter=",", quotechar='"', dtype=np.float64, ndmin=2)
    except ValueError:
        table = np.array([_parse_row(line, header, path, first_line + i) for i, line in enumerate(lines)])
    if table.shape[1] != len(header):
        raise DataError(f"{path}: line {first_line}: {table.shape[1]} cells, expected {len(header)}")
    return table


def _parse_row(line, header, path, number):
    cells = next(csv.reader([line.rstrip("\r\n")]))
    if len(cells) != len(header):
        raise DataError(f"{path}: line {number}: {len(cells)} cells, expected {len(header)}")
    row = []
    for name, cell in zip(header, cells):
        try:
            row.append(float(cell) if cell.strip() else np.nan)
        except ValueError:
            raise DataError(f"{path}: line {number}, column {name!r}: not a number: {cell!r}") from None
    return row
