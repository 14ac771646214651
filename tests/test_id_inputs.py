"""Inputs that hold ids (token ids, category ids) have no scale: no normalize-inputs, no standardisation.

Expectations come from numpy: the ids' own std is far above the scale limit, so a rule that
judged them as measurements would fire; it must not.
"""

from pathlib import Path

import numpy as np
import pytest

from nanscope.checkdata.scan import scan_data
from nanscope.data.inputs import id_inputs
from nanscope.model.factory import load_callable
from nanscope.rules.diagnose import SCALE_LIMIT
from nanscope.runtime import tensorflow
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions
from nanscope.run.verify import standardized_inputs

tf, keras = tensorflow()
MODELS = Path(__file__).parent / "specs" / "id_models.py"


def helper(name):
    return load_callable(f"{MODELS}:{name}", Path(__file__).parent, "test")


def document(model, data="tokens", loss="mse", lr=0.01, steps=6, model_args=None, data_args=None):
    return {
        "model": {"factory": f"{MODELS}:{model}", "args": model_args or {}},
        "data": {"factory": f"{MODELS}:{data}", "args": data_args or {}, "batch_size": 32, "shuffle": False},
        "train": {"loss": loss, "optimizer": {"name": "sgd", "learning_rate": lr}, "steps": steps, "seed": 0},
    }


def trace(tmp_path, doc):
    return run_trace(parse_spec(doc, source=str(tmp_path / "spec.yaml")), TraceOptions(trace_path=tmp_path / "t.jsonl"))


def ids(report):
    return [r.id for r in report.recommendations]


def test_int32_token_ids_get_no_normalize_inputs_in_a_run_that_fails_elsewhere(tmp_path):
    tokens = helper("tokens")

    x, _ = tokens()
    assert x.std() > SCALE_LIMIT  # as numbers, the ids are far from unit scale
    report = trace(tmp_path, document("classifier", model_args={"log_of_softmax": True}, lr=1e4,
                                      loss=f"{MODELS}:log_softmax_loss"))
    assert report.first_nonfinite is not None and report.first_nonfinite.phase != "data"
    assert "normalize-inputs" not in ids(report)
    assert ids(report)  # the real cause is still reported


def test_float_token_ids_that_feed_an_embedding_are_ids(tmp_path):
    report = trace(tmp_path, document("embedding_regressor", data_args={"dtype": "float32", "target_mean": 0.0}))
    assert "normalize-inputs" not in ids(report)


def test_a_measurement_beside_token_ids_is_named_and_only_it_is_standardised(tmp_path):
    tokens_and_prices = helper("tokens_and_prices")

    doc = document("tokens_and_price_model", data="tokens_and_prices", lr=1e-9)
    report = trace(tmp_path, doc)
    rec = report.recommendations[ids(report).index("normalize-inputs")]
    assert rec.data["features"] == ["x['price'][0]"]
    session = open_session(parse_spec(doc, source=str(tmp_path / "spec.yaml")))
    changed = standardized_inputs(session).data(session.train)
    x, _ = tokens_and_prices()
    np.testing.assert_array_equal(changed.x["tokens"], x["tokens"])
    price = changed.x["price"].astype(np.float64)
    assert abs(price.mean()) < 1e-4 and abs(price.std() - 1.0) < 1e-4


def test_check_data_judges_no_scale_of_integer_ids(tmp_path):
    tokens = helper("tokens")
    tokens_and_prices = helper("tokens_and_prices")

    x, y = tokens()
    np.savez(tmp_path / "ids.npz", x=x, y=y)
    scan = scan_data(tmp_path / "ids.npz")
    assert "normalize-inputs" not in [r.id for r in scan.recommendations]
    assert all(c.ids and c.scale is None for c in scan.inputs)
    prices = tokens_and_prices()[0]["price"]
    np.savez(tmp_path / "prices.npz", x=prices, y=y)
    assert "normalize-inputs" in [r.id for r in scan_data(tmp_path / "prices.npz").recommendations]


@pytest.mark.parametrize("dtype, expected", [(tf.int32, {"x"}), (tf.int64, {"x"}), (tf.float32, set()),
                                             (np.dtype("uint16"), {"x"}), ("float16", set())])
def test_id_inputs_reads_tensor_and_numpy_dtypes(dtype, expected):
    # The NanScope callback sees tensors, trace-steps numpy arrays: one function decides for both.
    assert id_inputs([("x", dtype)]) == expected


def test_id_inputs_finds_the_input_an_embedding_reads_in_a_list_of_inputs():
    tokens_and_price_model = helper("tokens_and_price_model")

    model = tokens_and_price_model()
    listed = keras.Model(list(model._inputs_struct.values()), model.outputs)
    assert id_inputs([("x[0]", "float32"), ("x[1]", "float32")], listed) == {"x[0]"}
    assert id_inputs([("x['price']", "float32"), ("x['tokens']", "float32")], model) == {"x['tokens']"}


def test_the_callback_raises_no_normalize_inputs_on_token_ids_in_a_failing_fit():
    from nanscope.keras import NanScope

    x, y = helper("tokens")()
    keras.utils.set_random_seed(0)
    model = helper("classifier")(log_of_softmax=True)
    model.compile(keras.optimizers.SGD(learning_rate=1e4), helper("log_softmax_loss"))
    callback = NanScope(verbose=0)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert callback.report.first_nonfinite is not None
    assert "normalize-inputs" not in [r.id for r in callback.report.recommendations]
