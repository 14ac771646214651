"""check-data on multi-output specs: one target array per output, one label check per classification output.

Every source form a multi-output spec can take (npz `y` mapping and list, npy `y`
mapping, csv and TFRecord `target` mappings, factory arrays and tf.data datasets with
dict or tuple targets) is written to disk with a NaN planted in the regression
output `price` and a label out of range in the classification output `kind`; the
scan must find each in its own output, and only there. numpy is the reference.
"""

import json
import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.checkdata import scan_data
from nanscope.cli import app

ROWS = 120
NAN_ROWS = [4, 40]
BAD_LABEL_ROW = 11
CLASSES = 3
PER_OUTPUT_LOSS = {"price": "mse", "kind": "sparse_categorical_crossentropy"}


def run_cli(*args):
    """(exit code, parsed JSON from stdout or None, stderr) of `nanscope check-data ARGS`."""
    result = CliRunner().invoke(app, ["check-data", *map(str, args)])
    stdout = result.stdout.strip()
    return result.exit_code, json.loads(stdout) if stdout.startswith("{") else None, result.stderr


def planted(rows=ROWS):
    """(x, price, kind): finite inputs, `price` with NaN at NAN_ROWS, integer `kind` with label 7 at BAD_LABEL_ROW."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, 3)).astype(np.float32)
    price = rng.standard_normal((rows, 1)).astype(np.float32)
    price[NAN_ROWS, 0] = np.nan
    kind = (np.arange(rows) % CLASSES).astype(np.int64)
    kind[BAD_LABEL_ROW] = 7
    return x, price, kind


def spec_dict(data, loss=PER_OUTPUT_LOSS, classes=CLASSES):
    return {"model": {"factory": "model.py:build", "args": {"classes": classes}}, "data": data, "train": {"loss": loss}}


def targets_by_array(doc):
    found = {}
    for column in doc["targets"]:
        found.setdefault(column["array"], []).append(column)
    return found


def assert_found_per_output(doc, price="price", kind="kind", price_output="price", kind_output="kind"):
    """The planted NaN is in `price` only, the bad label in `kind` only, each attributed to its output."""
    arrays = targets_by_array(doc)
    assert set(arrays) == {price, kind}
    assert [c["output"] for c in arrays[price]] == [price_output]
    assert {c["output"] for c in arrays[kind]} == {kind_output}
    assert (arrays[price][0]["nan"], arrays[price][0]["first_nonfinite_rows"]) == (len(NAN_ROWS), NAN_ROWS)
    assert sum(c["nonfinite"] for c in arrays[kind]) == 0
    checks = doc["label_checks"]
    assert [(c["output"], c["array"], c["kind"]) for c in checks] == [(kind_output, kind, "sparse")]
    assert (checks[0]["bad_rows"], checks[0]["first_bad_rows"], checks[0]["classes"]) == (1, [BAD_LABEL_ROW], CLASSES)
    assert doc["labels"] == checks[0]
    recommendations = {r["id"]: r for r in doc["recommendations"]}
    assert recommendations["clean-input-data"]["data"]["outputs"] == [price_output]
    assert recommendations["clean-input-data"]["data"]["role"] == "target"
    assert recommendations["fix-labels"]["data"] == {"bad_rows": 1, "output": kind_output}
    assert all(line.startswith(f"output {kind_output}: ") for line in recommendations["fix-labels"]["evidence"])
    assert doc["status"] == "problems"


def test_npz_y_mapping_through_the_cli(tmp_path, write_spec):
    x, price, kind = planted()
    np.savez(tmp_path / "train.npz", x=x, y_price=price, y_kind=kind)
    spec = write_spec(spec_dict({"path": "train.npz", "y": {"price": "y_price", "kind": "y_kind"}}))
    code, doc, stderr = run_cli(spec, "--json", "-")
    assert code == 1
    assert [c["name"] for c in doc["targets"]] == ["price", "kind"]
    assert_found_per_output(doc)
    kind_column = targets_by_array(doc)["kind"][0]
    assert kind_column["mean"] == pytest.approx(kind.mean()) and kind_column["max"] == 7
    assert "output kind" in stderr


def test_npz_y_list_pairs_losses_by_position(tmp_path, write_spec):
    x, price, kind = planted()
    np.savez(tmp_path / "train.npz", x=x, y_price=price, y_kind=kind)
    spec = write_spec(spec_dict({"path": "train.npz", "y": ["y_price", "y_kind"]},
                                loss=["mse", "sparse_categorical_crossentropy"]))
    doc = scan_data(spec, chunk_rows=7).to_json()
    assert_found_per_output(doc, price="y_price", kind="y_kind", price_output=0, kind_output=1)


def test_npy_y_mapping_with_one_hot_output(tmp_path, write_spec):
    x, price, _ = planted()
    onehot = np.eye(CLASSES, dtype=np.float32)[np.arange(ROWS) % CLASSES]
    onehot[BAD_LABEL_ROW] = [0.5, 0.2, 0.0]
    for name, array in (("x", x), ("price", price), ("kind", onehot)):
        np.save(tmp_path / f"{name}.npy", array)
    spec = write_spec(spec_dict({"path": "x.npy", "y": {"price": "price.npy", "kind": "kind.npy"}},
                                loss={"price": "mse", "kind": "categorical_crossentropy"}))
    doc = scan_data(spec, chunk_rows=16).to_json()
    assert [c["name"] for c in doc["targets"]] == ["price", "kind[0]", "kind[1]", "kind[2]"]
    assert targets_by_array(doc)["price"][0]["first_nonfinite_rows"] == NAN_ROWS
    (check,) = doc["label_checks"]
    assert (check["output"], check["kind"], check["first_bad_rows"]) == ("kind", "onehot", [BAD_LABEL_ROW])
    assert doc["description"] == f"x.npy + price.npy + kind.npy, {ROWS} rows"


def test_csv_target_mapping_keeps_header_names(tmp_path, write_spec):
    x, price, kind = planted()
    lines = ["a,b,c,p,k"] + [
        ",".join(map(str, [*row, "" if np.isnan(p) else p, k])) for row, p, k in zip(x.tolist(), price[:, 0], kind)
    ]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    spec = write_spec(spec_dict({"path": "train.csv", "target": {"price": "p", "kind": ["k"]}}))
    doc = scan_data(spec, chunk_rows=9).to_json()
    assert [c["name"] for c in doc["inputs"]] == ["a", "b", "c"]
    assert [(c["name"], c["array"]) for c in doc["targets"]] == [("p", "price"), ("k", "kind")]
    assert_found_per_output(doc)
    evidence = next(r for r in doc["recommendations"] if r["id"] == "clean-input-data")["evidence"]
    assert evidence[0].startswith("target p (output price): 2 NaN")


def test_tfrecord_target_mapping(tmp_path, write_spec):
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    x, price, kind = planted()
    with tf.io.TFRecordWriter(str(tmp_path / "train.tfrecord")) as writer:
        for row, p, k in zip(x, price, kind):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                       "price": tf.train.Feature(float_list=tf.train.FloatList(value=p)),
                       "kind": tf.train.Feature(int64_list=tf.train.Int64List(value=[k]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    features = {"x": {"dtype": "float32", "shape": [3]}, "price": {"dtype": "float32", "shape": [1]},
                "kind": {"dtype": "int64", "shape": []}}
    spec = write_spec(spec_dict({"path": "train.tfrecord", "features": features,
                                 "target": {"price": "price", "kind": "kind"}}))
    doc = scan_data(spec, chunk_rows=32).to_json()
    assert [c["name"] for c in doc["inputs"]] == ["x[0]", "x[1]", "x[2]"]
    assert_found_per_output(doc)


FACTORY = '''
import numpy as np

def planted():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 3)).astype(np.float32)
    price = rng.standard_normal((120, 1)).astype(np.float32)
    price[[4, 40], 0] = np.nan
    kind = (np.arange(120) % 3).astype(np.int64)
    kind[11] = 7
    return x, price, kind

def arrays_dict():
    x, price, kind = planted()
    return x, {"price": price, "kind": kind}

def arrays_list():
    x, price, kind = planted()
    return x, [price, kind]

def dataset_dict():
    import tensorflow as tf
    x, price, kind = planted()
    return tf.data.Dataset.from_tensor_slices((x, {"price": price, "kind": kind})).batch(16)

def dataset_tuple():
    import tensorflow as tf
    x, price, kind = planted()
    return tf.data.Dataset.from_tensor_slices((x, (price, kind)))
'''


@pytest.mark.parametrize(
    "factory, loss, names, outputs",
    [
        ("arrays_dict", PER_OUTPUT_LOSS, ("price", "kind"), ("price", "kind")),
        ("arrays_list", ["mse", "sparse_categorical_crossentropy"], ("y0", "y1"), (0, 1)),
        ("dataset_dict", PER_OUTPUT_LOSS, ("price", "kind"), ("price", "kind")),
        ("dataset_tuple", ["mse", "sparse_categorical_crossentropy"], ("y0", "y1"), (0, 1)),
    ],
)
def test_factory_targets_per_output(write_spec, factory, loss, names, outputs):
    spec = write_spec(spec_dict({"factory": f"data.py:{factory}"}, loss=loss), files={"data.py": FACTORY})
    doc = scan_data(spec, chunk_rows=25).to_json()
    assert doc["rows"] == ROWS
    assert_found_per_output(doc, price=names[0], kind=names[1], price_output=outputs[0], kind_output=outputs[1])


def test_one_loss_checks_every_output_with_its_own_classes(tmp_path, write_spec):
    x = np.random.default_rng(0).standard_normal((30, 2)).astype(np.float32)
    np.savez(tmp_path / "train.npz", x=x, a=np.arange(30) % 3, b=np.arange(30) % 5)
    data = {"path": "train.npz", "y": {"a": "a", "b": "b"}}
    spec = write_spec(spec_dict(data, loss="sparse_categorical_crossentropy", classes={"a": 3, "b": 5}))
    code, doc, _ = run_cli(spec, "--json", "-")
    assert code == 0 and doc["labels"] is None
    assert [(c["output"], c["classes"], c["bad_rows"]) for c in doc["label_checks"]] == [("a", 3, 0), ("b", 5, 0)]
    spec = write_spec(spec_dict(data, loss="sparse_categorical_crossentropy", classes=3))
    code, doc, _ = run_cli(spec, "--json", "-")
    assert code == 1 and [c["bad_rows"] for c in doc["label_checks"]] == [0, 12]
    assert [r["data"] for r in doc["recommendations"]] == [{"bad_rows": 12, "output": "b"}]


def test_single_output_json_keeps_its_shape(tmp_path, write_spec):
    x, _, kind = planted()
    np.savez(tmp_path / "train.npz", x=x, y=kind)
    doc = scan_data(write_spec(spec_dict({"path": "train.npz"}, loss="sparse_categorical_crossentropy"))).to_json()
    assert [(c["name"], c["array"], c["output"]) for c in doc["targets"]] == [("y", "y", None)]
    assert doc["labels"]["first_bad_rows"] == [BAD_LABEL_ROW] and doc["labels"]["output"] is None
    assert doc["label_checks"] == [doc["labels"]]
    assert next(r for r in doc["recommendations"] if r["id"] == "fix-labels")["data"] == {"bad_rows": 1}


def write_bad_inputs(tmp_path):
    x, price, kind = planted()
    np.savez(tmp_path / "train.npz", x=x, y_price=price, y_kind=kind)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "price.npy", price)
    (tmp_path / "train.csv").write_text("a,p,k\n1,2,0\n3,4,1\n")


@pytest.mark.parametrize(
    "data, loss, field",
    [
        ({"path": "train.npz", "y": {"price": "y_price", "kind": "y_kinds"}}, PER_OUTPUT_LOSS, "data.y.kind"),
        ({"path": "train.npz", "y": ["y_price", "nope"]}, ["mse", "mse"], "data.y[1]"),
        ({"path": "x.npy", "y": {"price": "price.npy", "kind": "kind.npy"}}, PER_OUTPUT_LOSS, "data.y.kind"),
        ({"path": "train.csv", "target": {"price": "p", "kind": ["k", "k2"]}}, PER_OUTPUT_LOSS, "data.target.kind"),
        ({"path": "train.npz", "y": {"price": "y_price", "kind": "y_kind"}}, {"price": "mse", "label": "mse"},
         "train.loss"),
        ({"path": "train.npz", "y": {"price": "y_price", "kind": "y_kind"}}, ["mse"] * 3, "train.loss"),
    ],
)
def test_bad_per_output_input_is_one_line_exit_2(tmp_path, write_spec, data, loss, field):
    write_bad_inputs(tmp_path)
    spec = write_spec(spec_dict(data, loss=loss))
    code, doc, stderr = run_cli(spec, "--json", "-")
    assert code == 2 and doc is None and "Traceback" not in stderr
    assert stderr.strip().count("\n") == 0 and f"{spec}: {field}: " in stderr


MODEL_WITHOUT_CLASS_ARGUMENT = """
import keras


def build():
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inputs)
    return keras.Model(inputs,
                       [keras.layers.Dense(1, name="price")(hidden), keras.layers.Dense(2, name="kind")(hidden)])
"""


def test_classes_come_from_the_model_output_width_when_the_spec_does_not_say(tmp_path, write_spec):
    x, price, kind = planted()
    kind[BAD_LABEL_ROW] = 2  # a valid label for 3 classes, outside the model's 2 `kind` units
    np.savez(tmp_path / "train.npz", x=x, y_price=price, y_kind=kind)
    spec = write_spec({"model": {"factory": "model.py:build"},
                       "data": {"path": "train.npz", "y": {"price": "y_price", "kind": "y_kind"}},
                       "train": {"loss": PER_OUTPUT_LOSS}}, files={"model.py": MODEL_WITHOUT_CLASS_ARGUMENT})
    code, doc, _ = run_cli(spec, "--json", "-")
    check = doc["label_checks"][0]
    assert code == 1 and (check["output"], check["classes"]) == ("kind", 2)
    assert check["bad_rows"] == int((kind >= 2).sum())
