"""The check-data part of the realistic corpus: real csv tables, the real CLI, and the printed fixes run as code.

A buggy table (`cases.CHECK_DATA_BUGGY`) must get its rule at its severity, with the planted columns or rows as
evidence; its healthy twin (`cases.CHECK_DATA_FIXED`) must get nothing at warning or error level. That the buggy
tables break training is shown with plain Keras and numpy; then the fix check-data prints is executed on the
buggy table, must give exactly the healthy twin, and a small Keras model must train on it: finite, its final loss
at least 1% below the loss of the best constant prediction.
"""

import importlib.util
import json
import math
import os
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.rules.catalogue import RULES
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("realistic_cases", HERE / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
_spec = importlib.util.spec_from_file_location("realistic_data_files", cases.DATA_FILES)
data_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(data_files)
ALARMS = ("warning", "error")
ALL_CASES = {**cases.CHECK_DATA_HEALTHY, **{name: args for name, (args, _, _) in cases.CHECK_DATA_BUGGY.items()}}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """{case: its csv file}, each written once."""
    folder = tmp_path_factory.mktemp("check-data-corpus")
    return {name: data_files.churn_csv(folder / f"{name}.csv", **args) for name, args in ALL_CASES.items()}


def check_data(path):
    """(exit code, nanscope.data/1 document) of `nanscope check-data PATH CHECK_DATA_ARGS --json -`."""
    result = CliRunner().invoke(app, ["check-data", str(path), *cases.CHECK_DATA_ARGS, "--json", "-"])
    return result.exit_code, json.loads(result.stdout)


def findings(doc):
    return {r["id"]: r for r in doc["recommendations"]}


def fixed(fix, x, y):
    """(x, y) after running the printed fix as code on them."""
    scope = {"np": np, "x": x.copy(), "y": y.copy()}
    exec(fix, scope)
    return scope["x"], scope["y"]


def constant_baseline(y):
    """Sparse cross-entropy of the best constant prediction: the entropy of the class frequencies."""
    share = np.bincount(y.astype(int)) / len(y)
    return float(-(share[share > 0] * np.log(share[share > 0])).sum())


def fit_losses(x, y, epochs=30):
    """Per-epoch losses of a small classifier on already-standardised x (2 logits, sparse cross-entropy)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(x, y, epochs=epochs, batch_size=64, shuffle=False, verbose=0).history["loss"]


def standardised(x):
    """The usual hand-written standardisation of a training script: (x - mean) / std per column."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x - x.mean(axis=0)) / x.std(axis=0)


def test_healthy_tables_get_no_finding_at_warning_or_error(tables):
    for name in cases.CHECK_DATA_HEALTHY:
        code, doc = check_data(tables[name])
        assert (code, doc["status"], doc["recommendations"]) == (0, "clean", []), name


def test_constant_columns_are_named_with_the_line_that_drops_them(tables):
    code, doc = check_data(tables["churn-csv-constant-country-and-vat"])
    assert (code, [r["id"] for r in doc["recommendations"]]) == (0, ["drop-constant-features"])
    rec = findings(doc)["drop-constant-features"]
    assert rec["severity"] == cases.CHECK_DATA_BUGGY["churn-csv-constant-country-and-vat"][2] == "info"
    assert rec["data"] == {"features": ["country_code", "vat_rate"]}
    assert rec["evidence"] == ["country_code = 44 in every row", "vat_rate = 0.2 in every row"]
    assert rec["fix"] == "x = np.delete(x, [3, 4], axis=-1)  # country_code, vat_rate: one value in every row"


def test_minus_1_labels_are_named_with_their_rows_and_the_lines_that_drop_them(tables):
    code, doc = check_data(tables["churn-csv-unknown-label-minus-1"])
    assert (code, doc["status"], [r["id"] for r in doc["recommendations"]]) == (1, "problems", ["fix-labels"])
    rec = findings(doc)["fix-labels"]
    assert rec["severity"] == cases.CHECK_DATA_BUGGY["churn-csv-unknown-label-minus-1"][2] == "error"
    assert rec["data"] == {"bad_rows": 6}
    assert rec["evidence"] == ["sparse_categorical_crossentropy: 6 row(s) hold a negative label "
                               "(first rows [17, 88, 251, 252, 430])"]
    assert doc["labels"]["class_counts"] == {"-1": 6, "0": 245, "1": 349}
    assert rec["fix"].splitlines()[0] == "keep = ((y >= 0) & (y < 2) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)"


def test_each_buggy_tables_printed_fix_gives_its_healthy_twin_exactly(tables):
    for name, (_, rule_id, _) in cases.CHECK_DATA_BUGGY.items():
        _, doc = check_data(tables[name])
        x, y, _ = data_files.read_csv(tables[name])
        twin_x, twin_y, _ = data_files.read_csv(tables[cases.CHECK_DATA_FIXED[name]])
        fixed_x, fixed_y = fixed(findings(doc)[rule_id]["fix"], x, y)
        np.testing.assert_array_equal(fixed_x, twin_x, err_msg=name)
        np.testing.assert_array_equal(fixed_y, twin_y, err_msg=name)


def test_the_default_constant_fix_drops_a_float32_constant_that_std_keeps(tables):
    x, y, names = data_files.read_csv(tables["churn-csv-constant-country-and-vat"])
    twin_x, _, _ = data_files.read_csv(tables["churn-csv"])
    # The old default, x[:, x.std(axis=0) > 0], kept vat_rate: float32 0.2 in every row has a std of 1.15e-6.
    assert x.std(axis=0)[names.index("vat_rate")] > 0 and x[:, x.std(axis=0) > 0].shape == (600, 5)
    np.testing.assert_array_equal(fixed(RULES["drop-constant-features"].fix, x, y)[0], twin_x)


def test_standardising_the_constant_column_is_nan_and_the_fixed_table_trains(tables):
    x, y, names = data_files.read_csv(tables["churn-csv-constant-country-and-vat"])
    assert np.isnan(standardised(x)).all(axis=0).tolist() == [name == "country_code" for name in names]
    assert math.isnan(fit_losses(standardised(x), y, epochs=1)[0])
    _, doc = check_data(tables["churn-csv-constant-country-and-vat"])
    x, y = fixed(findings(doc)["drop-constant-features"]["fix"], x, y)
    losses = fit_losses(standardised(x), y)
    assert all(map(math.isfinite, losses)) and losses[-1] < 0.99 * constant_baseline(y)


def test_minus_1_labels_break_the_sparse_loss_and_the_fixed_table_trains(tables):
    x, y, _ = data_files.read_csv(tables["churn-csv-unknown-label-minus-1"])
    try:  # TensorFlow raises on CPU for a label outside [0, classes); on a GPU the loss is NaN instead
        broken = not math.isfinite(fit_losses(standardised(x), y, epochs=1)[0])
    except tf.errors.InvalidArgumentError as error:
        broken = "Received a label value of -1" in str(error)
    assert broken
    _, doc = check_data(tables["churn-csv-unknown-label-minus-1"])
    x, y = fixed(findings(doc)["fix-labels"]["fix"], x, y)
    losses = fit_losses(standardised(x), y)
    assert all(map(math.isfinite, losses)) and losses[-1] < 0.99 * constant_baseline(y)
