"""masked-softmax: a softmax over a row with no valid position is blamed on the op that made the NaN.

The expectations come from plain TensorFlow: the masked softmax of each variant is
evaluated op by op on the failing batch's token ids, to find which op first holds NaN
and in which rows; the fully masked rows come from the token ids themselves.
"""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nanscope.spec.load import load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
sys.path.insert(0, str(SPECS))
import masked_softmax  # noqa: E402  (the specs' own model file, for its data and sizes)

BATCH = 16
NEG_INF = float("-inf")


def trace(name, tmp_path):
    return run_trace(load_spec(SPECS / f"{name}.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl"))


def tagged_line(tag):
    lines = (SPECS / "masked_softmax.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if f"# {tag}" in line)


def reference_ops(variant, tokens):
    """The plain-TF ops of each variant's masked softmax, in order, on random scores: [(op type, output)]."""
    valid = tf.constant(tokens != 0)
    scores = tf.random.stateless_normal(tokens.shape, seed=(1, 2))
    if variant == "where":
        filled = tf.where(valid, scores, NEG_INF)
        return [("SelectV2", filled), ("Softmax", tf.nn.softmax(filled, axis=-1))]
    if variant == "additive":
        bias = tf.where(valid, 0.0, NEG_INF)
        added = scores + bias
        return [("SelectV2", bias), ("AddV2", added), ("Softmax", tf.nn.softmax(added, axis=-1))]
    if variant == "handwritten":
        e = tf.exp(scores)
        masked = e * tf.cast(valid, e.dtype)
        total = tf.reduce_sum(masked, axis=-1, keepdims=True)
        return [("Exp", e), ("Mul", masked), ("Sum", total), ("RealDiv", masked / total)]
    length = tokens.shape[1]
    allowed = tf.range(length)[None, :] < tf.range(length)[:, None]
    scores = tf.random.stateless_normal((len(tokens), length, length), seed=(1, 2))
    filled = tf.where(allowed, scores, NEG_INF)
    return [("SelectV2", filled), ("Softmax", tf.nn.softmax(filled, axis=-1))]


def first_nan(ops):
    """(op type, per batch row whether it holds NaN) of the first op whose output holds NaN."""
    for op, output in ops:
        nan = np.isnan(output.numpy())
        if nan.any():
            return op, nan.reshape(len(nan), -1).any(axis=1)
    return None, None


@pytest.mark.parametrize("variant", ["where", "additive", "handwritten", "causal"])
def test_the_op_that_turns_the_mask_into_nan_is_the_producer(variant, tmp_path):
    tokens, _ = masked_softmax.padded_tokens()
    expected_op, expected_rows = first_nan(reference_ops(variant, tokens[:BATCH]))
    assert expected_op in ("Softmax", "RealDiv")  # the reference itself: the fill is never where NaN starts

    report = trace(f"masked-softmax-{variant}", tmp_path)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer_class, first.op) == (0, "forward", "MaskedPooling", expected_op)
    assert first.source.endswith(f"masked_softmax.py:{tagged_line(f'producer: {variant}')}")
    assert first.context["batch_rows"] == np.flatnonzero(expected_rows).tolist()
    top = report.recommendations[0]
    assert (top.id, top.severity) == ("masked-softmax", "error")
    assert top.data["dataset_rows"] == np.flatnonzero(expected_rows).tolist()  # shuffle: false, batch 0
    assert "-1e+09" in top.fix and "reduce_any(mask" in top.fix


def test_padding_only_rows_are_the_fully_masked_ones(tmp_path):
    tokens, _ = masked_softmax.padded_tokens()
    empty = np.flatnonzero((tokens[:BATCH] == 0).all(axis=1))
    report = trace("masked-softmax-where", tmp_path)
    context = report.first_nonfinite.context
    assert context["batch_rows"] == empty.tolist() and context["masked_rows"] == len(empty)
    assert context["softmax_rows"] == BATCH
    fill_line = tagged_line("fill: where")
    assert context["fill"] == {"op": "SelectV2", "source": f"tests/specs/masked_softmax.py:{fill_line}"}
    evidence = " ".join(report.recommendations[0].evidence)
    assert f"{len(empty)} of {BATCH} softmax rows" in evidence
    assert f"dataset rows {', '.join(map(str, empty))}" in evidence


def test_an_additive_mask_names_the_fill_behind_the_addition(tmp_path):
    context = trace("masked-softmax-additive", tmp_path).first_nonfinite.context
    assert context["fill"]["source"].endswith(f"masked_softmax.py:{tagged_line('fill: additive')}")


def test_a_wrong_causal_mask_names_the_query_with_nothing_to_attend_to(tmp_path):
    length = masked_softmax.LENGTH
    allowed = np.arange(length)[None, :] < np.arange(length)[:, None]
    queries = np.flatnonzero(~allowed.any(axis=1)).tolist()
    report = trace("masked-softmax-causal", tmp_path)
    context = report.first_nonfinite.context
    assert context["positions"] == [[q] for q in queries]
    assert context["masked_rows"] == BATCH * len(queries) and context["softmax_rows"] == BATCH * length
    assert context["batch_rows"] == list(range(BATCH))


def test_float16_fix_fills_with_half_the_dtype_minimum(tmp_path):
    report = trace("masked-softmax-float16", tmp_path)
    assert report.first_nonfinite.op == "Softmax"
    top = report.recommendations[0]
    assert top.id == "masked-softmax" and [r.id for r in report.recommendations] == ["masked-softmax"]
    fill = float(np.finfo(np.float16).min) / 2
    assert top.data["fill"] == fill and f"{fill:g}" in top.fix
    assert np.isfinite(np.float16(fill) + np.float16(-100.0))  # a score added to it stays finite


@pytest.mark.parametrize("name", ["masked-softmax-partial", "masked-softmax-finite"])
def test_partial_masks_and_the_fixed_model_stay_healthy(name, tmp_path):
    report = trace(name, tmp_path)
    assert report.status == "healthy"
    assert not [r for r in report.recommendations if r.severity in ("error", "warning")]
