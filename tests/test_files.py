"""One set of file readers (nanscope.data.files): training reads a file whole from the same blocks that
check-data streams over, so both see the same numbers, whatever the block size."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.checkdata.readers import open_stream
from nanscope.cli import app
from nanscope.data.files import whole
from nanscope.run.sources import load_data
from nanscope.runtime import tensorflow
from nanscope.spec.load import parse_spec

tf, _ = tensorflow()
ROWS = 23  # not a multiple of the block sizes below


def write_files(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 3)).astype(np.float32)
    x[4, 1] = np.nan
    y = rng.standard_normal((ROWS, 1)).astype(np.float32)
    np.savez_compressed(tmp_path / "d.npz", x=x, y=y)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    lines = [",".join("" if np.isnan(v) else repr(float(v)) for v in (*row, t)) for row, t in zip(x, y[:, 0])]
    (tmp_path / "d.csv").write_text('"a","b",c,target\n' + "\n".join(lines) + "\n\n", encoding="utf-8")
    with tf.io.TFRecordWriter(str(tmp_path / "d.tfrecord")) as writer:
        for row, t in zip(x, y):
            features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                        "y": tf.train.Feature(float_list=tf.train.FloatList(value=t))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return x, y


DATA = {
    "npz": {"path": "d.npz"},
    "npy": {"path": "x.npy", "y": "y.npy"},
    "csv": {"path": "d.csv", "target": "target"},
    "tfrecord": {"path": "d.tfrecord", "features": {"x": {"shape": [3]}, "y": {"shape": [1]}}, "target": "y"},
}


@pytest.mark.parametrize("kind", sorted(DATA))
@pytest.mark.parametrize("block", [1, 5, 1000])
def test_training_and_check_data_read_the_same_numbers(tmp_path, kind, block):
    x, y = write_files(tmp_path)
    spec = parse_spec({"model": {"factory": "m.py:f"}, "data": {**DATA[kind], "batch_size": 4},
                       "train": {"loss": "mse", "optimizer": "sgd", "steps": 1}}, source=str(tmp_path / "spec.yaml"))
    loaded = load_data(spec)
    stream = open_stream(spec.data, tmp_path, spec.source)
    streamed = whole(stream.chunks(block))
    (input_name,), (target_name,) = stream.inputs, stream.targets
    np.testing.assert_array_equal(loaded.x, x)
    np.testing.assert_array_equal(loaded.y, y)
    np.testing.assert_array_equal(streamed[input_name].astype(np.float32), x)
    np.testing.assert_array_equal(streamed[target_name].astype(np.float32).reshape(y.shape), y)


def test_a_csv_that_is_not_utf8_is_one_line_in_check_data_too(tmp_path):
    (tmp_path / "train.csv").write_bytes(b"a,b,label\n1,2,0\n1,\xff\xfe,1\n")
    result = CliRunner().invoke(app, ["check-data", str(tmp_path / "train.csv"), "--target", "label"])
    assert result.exit_code == 2
    assert "train.csv" in result.stderr and "UTF-8 csv" in result.stderr and "Traceback" not in result.stderr


def test_a_truncated_npz_member_is_one_line(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((1000, 8), np.float32), y=np.zeros((1000, 1), np.float32))
    data = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    result = CliRunner().invoke(app, ["check-data", str(tmp_path / "cut.npz")])
    assert result.exit_code == 2 and "cut.npz" in result.stderr and "Traceback" not in result.stderr
