"""How fast is `check-data`? Medians against the plain baselines, measured in one run.

Writes a float32 .npy file (default 2.1 GB) with a few NaN and Inf planted, and a
smaller csv and TFRecord file of the same kind of data, then times:

* npy: nanscope's `scan_data` against (a) the numpy one-pass floor (memory-mapped,
  chunked isnan/isinf counts and min/max/sum/sumsq per column) and (b) pandas
  `describe()` plus NaN/Inf counts on the whole array in memory;
* csv and TFRecord: `scan_data` against a plain tf.data read loop over the same file.

Targets: within 1.5x of the numpy floor, at least 3x faster than pandas. pandas is
needed only here (`pip install pandas`). The files go to a temporary folder that is
deleted at the end.

Usage:
    python bench/check_data_speed.py [--gb 2.1] [--columns 64] [--repeats 3] [--text-rows 50000]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from nanscope.checkdata import scan_data
from nanscope.checkdata.sampling import CHUNK_BYTES


def write_npy(path, rows, columns, seed=0):
    """A float32 .npy of standard-normal values, written in chunks, with NaN/Inf planted; returns the plants."""
    rng = np.random.default_rng(seed)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, columns))
    step = 1 << 20
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        array[start:stop] = rng.standard_normal((stop - start, columns), dtype=np.float32)
    plants = {(rows // 3, 1): np.nan, (rows // 2, 5): np.inf, (rows - 7, columns - 1): -np.inf, (11, 0): np.nan}
    for (row, column), value in plants.items():
        array[row, column] = value
    array.flush()
    del array
    return plants


def numpy_floor(path):
    """The one-pass floor: memory-mapped, chunked isnan/isinf counts and min/max/sum/sumsq per column."""
    x = np.load(path, mmap_mode="r")
    rows = max(1, CHUNK_BYTES // (x.shape[1] * x.itemsize))
    nan = posinf = 0
    low, high = np.full(x.shape[1], np.inf, np.float32), np.full(x.shape[1], -np.inf, np.float32)
    total, squares = np.zeros(x.shape[1]), np.zeros(x.shape[1])
    for start in range(0, len(x), rows):
        chunk = x[start : start + rows]
        nan = nan + np.isnan(chunk).sum(axis=0)
        posinf = posinf + np.isinf(chunk).sum(axis=0)
        low, high = np.fmin(low, np.fmin.reduce(chunk, axis=0)), np.fmax(high, np.fmax.reduce(chunk, axis=0))
        total += np.add.reduce(chunk, axis=0, dtype=np.float64)
        squares += np.add.reduce(np.square(chunk), axis=0, dtype=np.float64)
    return nan, posinf, low, high, total, squares


def pandas_describe(path):
    """pandas' way: the whole array in a DataFrame, describe() plus NaN and Inf counts."""
    import pandas as pd

    frame = pd.DataFrame(np.load(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # pandas' std over the planted Inf
        return frame.describe(), frame.isna().sum(), np.isinf(frame).sum()


def write_text_files(folder, x):
    """A csv (with a target column) and a TFRecord file of the rows of `x`."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    csv_path, record_path = folder / "data.csv", folder / "data.tfrecord"
    header = ",".join([f"f{i}" for i in range(x.shape[1])] + ["y"])
    np.savetxt(csv_path, np.c_[x, np.arange(len(x)) % 2], delimiter=",", header=header, comments="", fmt="%.7g")
    with tf.io.TFRecordWriter(str(record_path)) as writer:
        for row in x:
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return csv_path, record_path


def tf_csv_loop(path, columns):
    """A plain tf.data read loop over the csv file."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    dataset = tf.data.experimental.CsvDataset(str(path), [tf.float32] * (columns + 1), header=True).batch(16384)
    for _ in dataset:
        pass


def tf_record_loop(path, columns):
    """A plain tf.data read loop over the TFRecord file, parsing each batch."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    spec = {"x": tf.io.FixedLenFeature([columns], tf.float32)}
    for records in tf.data.TFRecordDataset(str(path)).batch(16384):
        tf.io.parse_example(records, spec)


def median_seconds(function, repeats):
    """Median wall time of `repeats` calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def check_found(path, plants, target=None):
    """Fail loudly if nanscope misses a planted value: a fast wrong answer is no answer."""
    inputs = scan_data(path, target=target).inputs
    found = sum(c.nonfinite for c in inputs)
    if found != len(plants):
        raise SystemExit(f"{path.name}: nanscope found {found} non-finite values, planted {len(plants)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.1, help="Size of the .npy file in GB.")
    parser.add_argument("--columns", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text-rows", type=int, default=50_000, help="Rows of the csv and TFRecord files.")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="nanscope-bench-", dir="/tmp"))
    try:
        rows = int(args.gb * 1e9) // (4 * args.columns)
        npy = folder / "x.npy"
        plants = write_npy(npy, rows, args.columns)
        print(f"npy: {rows:,} rows x {args.columns} float32 = {npy.stat().st_size / 1e9:.2f} GB, {len(plants)} planted")
        check_found(npy, plants)
        results = [
            ("npy", "nanscope scan_data", median_seconds(lambda: scan_data(npy), args.repeats)),
            ("npy", "numpy one-pass floor", median_seconds(lambda: numpy_floor(npy), args.repeats)),
            ("npy", "pandas describe()", median_seconds(lambda: pandas_describe(npy), args.repeats)),
        ]
        x = np.load(npy, mmap_mode="r")[: args.text_rows]
        text_plants = {k: v for k, v in plants.items() if k[0] < args.text_rows}
        csv_path, record_path = write_text_files(folder, np.asarray(x))
        check_found(csv_path, text_plants, target="y")
        check_found(record_path, text_plants)
        results += [
            ("csv", "nanscope scan_data", median_seconds(lambda: scan_data(csv_path, target="y"), args.repeats)),
            ("csv", "tf.data CsvDataset loop",
             median_seconds(lambda: tf_csv_loop(csv_path, args.columns), args.repeats)),
            ("tfrecord", "nanscope scan_data", median_seconds(lambda: scan_data(record_path), args.repeats)),
            ("tfrecord", "tf.data TFRecord loop",
             median_seconds(lambda: tf_record_loop(record_path, args.columns), args.repeats)),
        ]
        print_table(results, args.repeats, args.text_rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def print_table(results, repeats, text_rows):
    """One line per timing, with its ratio to nanscope on the same file."""
    ours = {kind: seconds for kind, name, seconds in results if name.startswith("nanscope")}
    print(f"\nmedian of {repeats} runs (csv / tfrecord: {text_rows:,} rows)")
    print(f"{'file':<9} {'method':<26} {'median s':>9} {'vs nanscope':>12}")
    for kind, name, seconds in results:
        ratio = seconds / ours[kind]
        print(f"{kind:<9} {name:<26} {seconds:>9.3f} {ratio:>11.2f}x")
    floor = next(s for k, n, s in results if n.startswith("numpy"))
    pandas_time = next(s for k, n, s in results if n.startswith("pandas"))
    print(f"\nnanscope / numpy floor: {ours['npy'] / floor:.2f}x (target <= 1.5x)")
    print(f"pandas / nanscope:      {pandas_time / ours['npy']:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
