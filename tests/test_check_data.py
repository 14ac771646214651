"""check-data end to end: real files on disk, the real CLI, numpy as the reference."""

import json
import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nanscope.checkdata import scan_data
from nanscope.cli import app
from nanscope.rules.catalogue import RULES

RNG = np.random.default_rng(7)


def run_cli(*args):
    """(exit code, parsed JSON from stdout or None, stderr)."""
    result = CliRunner().invoke(app, ["check-data", *map(str, args)])
    stdout = result.stdout.strip()
    document = json.loads(stdout) if stdout.startswith("{") else None
    return result.exit_code, document, result.stderr


def planted_x(rows=200, features=5):
    """Standard-normal features with NaN at (3, 1), (50, 1), +Inf at (7, 2), -Inf at (120, 4)."""
    x = RNG.standard_normal((rows, features)).astype(np.float32)
    x[3, 1] = x[50, 1] = np.nan
    x[7, 2] = np.inf
    x[120, 4] = -np.inf
    return x


def by_name(entries):
    return {e["name"]: e for e in entries}


def assert_planted(inputs, names):
    """The planted NaN/Inf of `planted_x` are found exactly, under the given column names."""
    entries = by_name(inputs)
    assert (entries[names[1]]["nan"], entries[names[1]]["first_nonfinite_rows"]) == (2, [3, 50])
    assert (entries[names[2]]["posinf"], entries[names[2]]["first_nonfinite_rows"]) == (1, [7])
    assert (entries[names[4]]["neginf"], entries[names[4]]["first_nonfinite_rows"]) == (1, [120])
    assert sum(e["nan"] + e["posinf"] + e["neginf"] for e in inputs) == 4


def write_spec(tmp_path, data, loss="mse", model_args=None):
    path = tmp_path / "run.yaml"
    spec = {"model": {"factory": "model.py:build", "args": model_args or {}}, "data": data, "train": {"loss": loss}}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_npz_direct_json_to_stdout(tmp_path):
    x = planted_x()
    np.savez(tmp_path / "train.npz", x=x, y=RNG.standard_normal((200, 1)))
    code, doc, stderr = run_cli(tmp_path / "train.npz", "--json", "-")
    assert code == 1 and doc["schema"] == "nanscope.data/1" and doc["status"] == "problems"
    assert doc["rows"] == 200 and len(doc["inputs"]) == 5 and len(doc["targets"]) == 1
    assert_planted(doc["inputs"], [f"x[{i}]" for i in range(5)])
    assert [r["id"] for r in doc["recommendations"]] == ["clean-input-data"]
    assert "clean-input-data" in stderr


def test_statistics_match_numpy(tmp_path):
    x = planted_x(rows=500)
    x[:, 0] = x[:, 0] * 1e3 + 1e6
    x[::4, 3] = 0.0
    np.savez(tmp_path / "train.npz", x=x, y=np.zeros((500, 1)))
    doc = scan_data(tmp_path / "train.npz", chunk_rows=37).to_json()
    finite = np.ma.masked_invalid(x.astype(np.float64))
    for i, entry in enumerate(doc["inputs"]):
        column = finite[:, i].compressed()
        assert entry["min"] == pytest.approx(column.min()) and entry["max"] == pytest.approx(column.max())
        assert entry["mean"] == pytest.approx(column.mean(), rel=1e-7, abs=1e-7 * column.std())
        assert entry["std"] == pytest.approx(column.std(), rel=1e-6)
        assert entry["zeros"] == pytest.approx(np.mean(x[:, i] == 0))
    assert doc["inputs"][0]["scale"] == "large"
    assert "normalize-inputs" in [r["id"] for r in doc["recommendations"]]


def test_chunked_equals_one_shot(tmp_path):
    x = planted_x(rows=301)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", RNG.standard_normal(301))
    spec = write_spec(tmp_path, {"path": "x.npy", "y": "y.npy"})
    tiny, whole = scan_data(spec, chunk_rows=3).to_json(), scan_data(spec, chunk_rows=10_000).to_json()
    for a, b in zip(tiny["inputs"] + tiny["targets"], whole["inputs"] + whole["targets"]):
        for key in ("nan", "posinf", "neginf", "min", "max", "zeros", "first_nonfinite_rows"):
            assert a[key] == b[key], key
        assert a["mean"] == pytest.approx(b["mean"], rel=1e-6, abs=1e-7)
        assert a["std"] == pytest.approx(b["std"], rel=1e-6)
    assert_planted(tiny["inputs"], [f"x[{i}]" for i in range(5)])


def test_csv_with_target_and_empty_cells(tmp_path):
    x = planted_x(rows=160)
    lines = ["a,b,c,d,e,label"] + [",".join(map(str, row)) + f",{i % 3}" for i, row in enumerate(x.tolist())]
    lines[1 + 50] = lines[1 + 50].replace("nan", "")
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    code, doc, _ = run_cli(tmp_path / "train.csv", "--target", "label", "--json", "-")
    assert code == 1 and doc["rows"] == 160 and [t["name"] for t in doc["targets"]] == ["label"]
    assert_planted(doc["inputs"], list("abcde"))


def test_csv_with_quoted_header_and_cells(tmp_path):
    # Spreadsheet exports quote names with commas and sometimes numbers too.
    lines = ['"price, usd",size,"label"'] + [f'"{i * 1.5}",{i},"{i % 2}"' for i in range(40)]
    lines[7] = '"nan",6,"0"'
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    code, doc, _ = run_cli(tmp_path / "train.csv", "--target", "label", "--json", "-")
    assert code == 1 and doc["rows"] == 40
    assert [c["name"] for c in doc["inputs"]] == ["price, usd", "size"]
    price = doc["inputs"][0]
    assert price["nan"] == 1 and price["max"] == 39 * 1.5


def test_tfrecord_via_spec(tmp_path):
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    x = planted_x(rows=150)
    with tf.io.TFRecordWriter(str(tmp_path / "train.tfrecord")) as writer:
        for row, label in zip(x, RNG.integers(0, 4, 150)):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    features = {"x": {"dtype": "float32", "shape": [5]}, "label": {"dtype": "int64", "shape": []}}
    spec = write_spec(tmp_path, {"path": "train.tfrecord", "features": features, "target": "label"},
                      loss="sparse_categorical_crossentropy", model_args={"classes": 4})
    doc = scan_data(spec, chunk_rows=16).to_json()
    assert doc["rows"] == 150 and doc["labels"]["classes"] == 4 and doc["labels"]["bad_rows"] == 0
    assert_planted(doc["inputs"], [f"x[{i}]" for i in range(5)])
    direct = scan_data(tmp_path / "train.tfrecord", target="label").to_json()
    assert_planted(direct["inputs"], [f"x[{i}]" for i in range(5)])


def test_synthetic_classification_is_clean(tmp_path):
    spec = write_spec(tmp_path, {"synthetic": {"kind": "classification", "samples": 300, "features": 4, "classes": 3}},
                      loss="sparse_categorical_crossentropy")
    code, doc, _ = run_cli(spec, "--json", "-")
    assert (code, doc["status"], doc["rows"]) == (0, "clean", 300)
    assert sum(doc["labels"]["class_counts"].values()) == 300 and set(doc["labels"]["class_counts"]) <= {"0", "1", "2"}


def test_synthetic_regression_targets_need_scaling(tmp_path):
    spec = write_spec(tmp_path, {"synthetic": {"kind": "regression", "samples": 300, "features": 4}})
    code, doc, _ = run_cli(spec, "--json", "-")
    assert code == 1 and [r["id"] for r in doc["recommendations"]] == ["normalize-targets"]


FACTORY = '''
import numpy as np

def arrays():
    x = np.random.default_rng(0).standard_normal((40, 6, 6, 3)).astype("float32")
    x[9, 2, 4, 1] = np.nan
    x[30, 0, 0, 2] = np.inf
    return x, np.eye(3)[np.arange(40) % 3]

def dataset():
    import tensorflow as tf
    x, y = arrays()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(7)
'''


@pytest.mark.parametrize("factory", ["data.py:arrays", "data.py:dataset"])
def test_factory_images_per_channel(tmp_path, factory):
    (tmp_path / "data.py").write_text(FACTORY)
    spec = write_spec(tmp_path, {"factory": factory}, loss="categorical_crossentropy")
    doc = scan_data(spec).to_json()
    assert doc["rows"] == 40 and [c["name"] for c in doc["inputs"]] == [f"x[..., {i}]" for i in range(3)]
    channels = doc["inputs"]
    assert (channels[1]["nan"], channels[1]["first_nonfinite_rows"]) == (1, [9])
    assert (channels[2]["posinf"], channels[2]["first_nonfinite_rows"]) == (1, [30])
    assert channels[0]["positions"] == 36 and channels[0]["values"] == 40 * 36
    assert doc["labels"]["classes"] == 3 and doc["labels"]["bad_rows"] == 0


def test_label_checks(tmp_path):
    x = RNG.standard_normal((30, 2))
    np.savez(tmp_path / "sparse.npz", x=x, y=np.r_[np.arange(28) % 3, 3, -1])
    doc = scan_data(tmp_path / "sparse.npz", loss="sparse_categorical_crossentropy", classes=3).to_json()
    assert doc["labels"]["first_bad_rows"] == [28, 29] and doc["recommendations"][0]["id"] == "fix-labels"
    onehot = np.eye(4)[np.arange(30) % 4]
    onehot[5] = [0.5, 0.2, 0.0, 0.0]
    np.savez(tmp_path / "onehot.npz", x=x, y=onehot)
    doc = scan_data(tmp_path / "onehot.npz", loss="CategoricalCrossentropy").to_json()
    assert (doc["labels"]["bad_rows"], doc["labels"]["first_bad_rows"]) == (1, [5])
    np.savez(tmp_path / "binary.npz", x=x, y=np.r_[np.zeros(29), 2.0])
    code, doc, _ = run_cli(tmp_path / "binary.npz", "--loss", "binary_crossentropy", "--json", "-")
    assert code == 1 and doc["labels"]["first_bad_rows"] == [29]
    np.savez(tmp_path / "fine.npz", x=x, y=np.arange(30) % 2)
    assert run_cli(tmp_path / "fine.npz", "--loss", "binary_crossentropy")[0] == 0


def test_masked_feature_is_reported_not_a_problem(tmp_path):
    x = RNG.standard_normal((50, 3)).astype(np.float32)
    x[4, 1] = np.nan
    np.savez(tmp_path / "train.npz", x=x, y=RNG.standard_normal(50))
    spec = write_spec(tmp_path, {"path": "train.npz", "allow_nonfinite": ["x[1]"]})
    code, doc, _ = run_cli(spec, "--json", "-")
    assert (code, doc["status"]) == (0, "clean")
    assert doc["inputs"][1]["nan"] == 1 and doc["inputs"][1]["allowed_nonfinite"] is True


def test_sample_scans_part_of_the_rows(tmp_path):
    np.save(tmp_path / "x.npy", RNG.standard_normal((1000, 2)).astype(np.float32))
    doc = scan_data(tmp_path / "x.npy", sample=100).to_json()
    assert (doc["rows"], doc["scanned_rows"], doc["sampled"]) == (1000, 100, True)
    assert doc["inputs"][0]["values"] == 100 and doc["targets"] == []


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((0, 3)), "y": np.zeros(0)}, "empty (0 rows)"),
        ({"x": np.zeros((10, 3)), "y": np.zeros(9)}, "x has 10 rows but y has 9"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, arrays, message):
    np.savez(tmp_path / "train.npz", **arrays)
    code, doc, stderr = run_cli(tmp_path / "train.npz", "--json", "-")
    assert code == 2 and doc is None
    assert stderr.strip().count("\n") == 0 and "train.npz" in stderr and message in stderr
    assert "Traceback" not in stderr


def test_missing_key_and_empty_csv_name_the_file(tmp_path):
    np.savez(tmp_path / "train.npz", inputs=np.zeros((3, 2)), y=np.zeros(3))
    code, _, stderr = run_cli(tmp_path / "train.npz")
    assert code == 2 and "train.npz: data.x:" in stderr
    (tmp_path / "empty.csv").write_text("a,b\n")
    code, _, stderr = run_cli(tmp_path / "empty.csv", "--target", "b")
    assert code == 2 and "empty.csv" in stderr and "empty" in stderr


def test_csv_chunks_equal_one_shot(tmp_path):
    x = planted_x(rows=130)
    lines = ["a,b,c,d,e,y"] + [",".join(map(str, row)) + ",1.5" for row in x.tolist()]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    tiny = scan_data(tmp_path / "train.csv", target="y", chunk_rows=7).to_json()
    whole = scan_data(tmp_path / "train.csv", target="y").to_json()
    assert [e["first_nonfinite_rows"] for e in tiny["inputs"]] == [e["first_nonfinite_rows"] for e in whole["inputs"]]
    assert [e["std"] for e in tiny["inputs"]] == pytest.approx([e["std"] for e in whole["inputs"]], rel=1e-9)
    assert tiny["targets"][0]["constant"] is True


def test_column_stats_merge_matches_single_pass():
    from nanscope.checkdata.stats import ColumnStats

    x = planted_x(rows=250)
    left, right, single = ColumnStats(5), ColumnStats(5), ColumnStats(5)
    left.update(x[:90], np.arange(90))
    right.update(x[90:], np.arange(90, 250))
    single.update(x, np.arange(250))
    left.merge(right)
    for name in ("count", "nan", "posinf", "neginf", "zeros", "min", "max"):
        np.testing.assert_array_equal(getattr(left, name), getattr(single, name))
    np.testing.assert_allclose(left.std(), single.std(), rtol=1e-6)
    assert left.first_nonfinite_rows == single.first_nonfinite_rows


def test_npz_scan_does_not_import_tensorflow(tmp_path):
    import subprocess
    import sys

    np.savez(tmp_path / "train.npz", x=planted_x(), y=np.zeros(200))
    code = (
        "import sys; from nanscope.checkdata import scan_data; "
        f"scan_data({str(tmp_path / 'train.npz')!r}); assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_file_type_is_bad_input(tmp_path):
    (tmp_path / "train.parquet").write_bytes(b"")
    code, _, stderr = run_cli(tmp_path / "train.parquet")
    assert code == 2 and "train.parquet" in stderr


def test_sequence_input_per_feature_over_time_steps(tmp_path):
    x = RNG.standard_normal((20, 9, 2)).astype(np.float32)
    x[4, 7, 1] = np.nan
    x[4, 8, 1] = np.nan
    x[15, 0, 1] = -np.inf
    np.savez(tmp_path / "seq.npz", x=x, y=RNG.standard_normal((20, 1)))
    inputs = scan_data(tmp_path / "seq.npz", chunk_rows=6).to_json()["inputs"]
    assert [c["name"] for c in inputs] == ["x[..., 0]", "x[..., 1]"]
    assert (inputs[1]["nan"], inputs[1]["neginf"], inputs[1]["first_nonfinite_rows"]) == (2, 1, [4, 15])
    assert inputs[0]["mean"] == pytest.approx(float(x[..., 0].astype(np.float64).mean()), rel=1e-6)


def test_classes_come_from_the_model_output_width(tmp_path, write_spec):
    labels = np.arange(60) % 4  # labels 0..3 for a model with 3 output units
    np.savez(tmp_path / "train.npz", x=RNG.standard_normal((60, 2)).astype(np.float32), y=labels)
    model = "import keras\n\ndef build():\n    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])\n"
    spec = write_spec({"model": {"factory": "model.py:build"}, "data": {"path": "train.npz"},
                       "train": {"loss": "sparse_categorical_crossentropy"}}, files={"model.py": model})
    code, doc, _ = run_cli(spec, "--json", "-")
    assert code == 1 and doc["labels"]["classes"] == 3 and doc["labels"]["bad_rows"] == 15
    assert [r["id"] for r in doc["recommendations"]] == ["fix-labels"]


def test_each_label_problem_lists_its_own_rows_and_every_label_is_counted(tmp_path):
    """Row 28 holds 3 (>= classes), row 29 holds -1: two problems, each with its own row; -1 is counted."""
    x = RNG.standard_normal((30, 2))
    np.savez(tmp_path / "sparse.npz", x=x, y=np.r_[np.arange(28) % 3, 3, -1])
    scan = scan_data(tmp_path / "sparse.npz", loss="sparse_categorical_crossentropy", classes=3)
    labels = scan.labels
    assert labels.problems == ["1 row(s) hold a negative label", "1 row(s) hold a label >= classes (3)"]
    assert labels.problem_rows == [[29], [28]]
    assert labels.class_counts == {-1: 1, 0: 10, 1: 9, 2: 9, 3: 1}
    evidence = next(r for r in scan.recommendations if r.id == "fix-labels").evidence
    assert evidence == ["sparse_categorical_crossentropy: 1 row(s) hold a negative label (first rows [29])",
                        "sparse_categorical_crossentropy: 1 row(s) hold a label >= classes (3) (first rows [28])"]
    np.savez(tmp_path / "signs.npz", x=x, y=np.where(np.arange(30) % 3 == 0, -1.0, 1.0))  # a {-1, 1} encoding
    binary = scan_data(tmp_path / "signs.npz", loss="binary_crossentropy").labels
    assert binary.class_counts == {-1: 10, 1: 20} and binary.problem_rows == [[0, 3, 6, 9, 12]]


def test_the_printed_label_fix_keeps_exactly_the_rows_that_fit_the_loss_and_the_rescan_is_clean(tmp_path):
    x = RNG.standard_normal((30, 2))
    checks = [("sparse", np.r_[np.arange(28) % 3, 3, -1].reshape(30, 1), ("--classes", "3"), 28,
               "keep = ((y >= 0) & (y < 3) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)"),
              ("sparse", np.r_[np.arange(28) % 3, 1.5, -1], (), 28,
               "keep = ((y >= 0) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)"),
              ("binary", np.r_[np.zeros(28), 1.0, 2.0], (), 29,
               "keep = ((y >= 0) & (y <= 1)).reshape(len(y), -1).all(axis=1)")]
    for kind, y, classes, kept, first_line in checks:
        loss = {"sparse": "sparse_categorical_crossentropy", "binary": "binary_crossentropy"}[kind]
        np.savez(tmp_path / "train.npz", x=x, y=y)
        code, doc, _ = run_cli(tmp_path / "train.npz", "--loss", loss, *classes, "--json", "-")
        fix = next(r for r in doc["recommendations"] if r["id"] == "fix-labels")["fix"]
        assert code == 1 and fix.splitlines()[0] == first_line, kind
        scope = {"np": np, "x": x, "y": y}
        exec(fix, scope)
        assert len(scope["x"]) == len(scope["y"]) == kept, kind
        np.savez(tmp_path / "fixed.npz", x=scope["x"], y=scope["y"])
        assert run_cli(tmp_path / "fixed.npz", "--loss", loss, *classes)[0] == 0, kind


def test_one_hot_labels_keep_the_rules_text_and_constant_columns_are_dropped_by_position(tmp_path):
    x = RNG.standard_normal((30, 3))
    x[:, 1] = 7.0
    onehot = np.eye(4)[np.arange(30) % 4]
    onehot[5] = [0.5, 0.2, 0.0, 0.0]
    np.savez(tmp_path / "train.npz", x=x, y=onehot)
    found = {r.id: r for r in scan_data(tmp_path / "train.npz", loss="categorical_crossentropy").recommendations}
    assert found["fix-labels"].fix == RULES["fix-labels"].fix
    assert found["drop-constant-features"].fix == "x = np.delete(x, [1], axis=-1)  # x[1]: one value in every row"
