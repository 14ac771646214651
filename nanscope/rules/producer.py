"""Detectors that read the producing op found by the forensic replay.

The replay names the op (Log, Exp, RealDiv, Sqrt, their gradients, an optimizer
update) and the statistics of its operand. These detectors turn that into the
rule that fixes it, citing the op, the layer, the source line and the values.
"""

import math

import numpy as np

from nanscope.rules.catalogue import recommend

LOG_OPS = {"Log", "Log1p", "Xlogy", "Xlog1py"}
EXP_OPS = {"Exp", "Expm1"}
DIVISION_OPS = {"RealDiv", "Div", "Reciprocal", "Inv", "Rsqrt", "FloorDiv", "TruncateDiv", "Xdivy", "RsqrtGrad"}
SQRT_OPS = {"Sqrt"}
# exp(x) overflows once x exceeds log(dtype max): 88.72 for float32, 11.09 for float16.
EXP_OVERFLOW = {name: math.log(float(np.finfo(name).max)) for name in ("float16", "float32", "float64")}
EXP_OVERFLOW["bfloat16"] = EXP_OVERFLOW["float32"]
# A clamp for exp's argument that stays below the bound: exp(11) = 59874 < 65504 in float16.
EXP_CLAMP = {"float16": 11.0, "float32": 80.0, "float64": 80.0, "bfloat16": 80.0}
# Largest finite float16 (numpy.finfo(float16).max).
FLOAT16_MAX = float(np.finfo(np.float16).max)
# A masked position's fill: finite, so a row with no valid position stays finite, and far below any
# score. Half the dtype's most negative value, so that adding a score to it cannot overflow; float32
# and bfloat16 take the usual -1e9, which is far inside their range.
MASK_FILL = {"float16": float(np.finfo(np.float16).min) / 2}
DEFAULT_MASK_FILL = -1e9


def producer_findings(report, evidence, healthy):
    """(score, Recommendation) pairs for the op that produced the first non-finite value."""
    first = report.first_nonfinite
    if first is None or first.phase == "data":
        return []
    inputs = first.inputs or {}
    op = inputs.get("op") or first.op
    where = _where(first)
    context = first.context or {}
    if context.get("masked_rows"):
        return [(1.0, _masked_softmax(first, where, context, _dataset_rows(evidence, first.step)))]
    if first.phase == "backward" and context.get("discarded_by"):
        return [(1.0, _double_where(first, where, inputs, context))]
    found = []
    if inputs.get("dtype") == "float16" and first.phase != "update":
        found.append((0.95, _loss_scaling(report, first, where, inputs)))
    if first.phase == "update" and not _any_bad_grad(report):
        found.append((1.0, _optimizer_epsilon(report, first, where, inputs)))
    elif op in LOG_OPS:
        found.append((1.0, _stable_log(first, where, inputs)))
    elif op in EXP_OPS and inputs.get("max", 0.0) > EXP_OVERFLOW.get(inputs.get("dtype"), EXP_OVERFLOW["float32"]):
        found.append((1.0, _stable_exp(first, where, inputs)))
    elif op in DIVISION_OPS:
        found.append((1.0, _safe_division(first, where, inputs)))
    elif op in SQRT_OPS:
        found.append((1.0, _safe_sqrt(first, where, inputs)))
    return found


def _where(first):
    parts = [f"step {first.step}, {first.phase} pass"]
    if first.layer:
        parts.append(f"layer {first.layer}" + (f" ({first.layer_class})" if first.layer_class else ""))
    if getattr(first, "loss", None):
        parts.append(first.loss if first.loss == "the loss" else f"loss {first.loss}")  # the loss has no name
    if getattr(first, "output", None):
        parts.append(f"output {first.output!r}")
    function = (getattr(first, "context", None) or {}).get("function")
    if function:
        parts.append(f"node {function['node']} inside the function call {function['call']}")
    if first.source:
        parts.append(first.source)
    return ", ".join(parts)


def _operand(inputs):
    return (f"{inputs.get('operand', 'input')} min {inputs.get('min', float('nan')):.4g}, "
            f"max {inputs.get('max', float('nan')):.4g}, {inputs.get('zero_fraction', 0.0):.1%} zeros, "
            f"{inputs.get('negative_fraction', 0.0):.1%} negative")


def _source_fix(first, snippet):
    return f"# {first.source}: change this line\n{snippet}" if first.source else snippet


def _data(first, inputs):
    return {"step": first.step, "op": first.op, "layer": first.layer, "source": first.source, **inputs}


def _masked_softmax(first, where, context, dataset_rows):
    masked, total, batch_rows = context["masked_rows"], context["softmax_rows"], context.get("batch_rows", [])
    evidence = [f"{where}: {first.op} turned {masked} of {total} softmax rows into NaN: every position of those "
                f"rows is masked, and a softmax over no position is 0/0"]
    if batch_rows:
        rows = [dataset_rows[i] for i in batch_rows if i < len(dataset_rows)] if dataset_rows is not None else []
        evidence.append(f"fully masked in {len(batch_rows)} batch row(s): {_listed(batch_rows)}"
                        + (f" (dataset rows {_listed(rows)})" if rows else "")
                        + "; empty sequences, padding-only rows or a causal mask that masks every key")
    if context.get("positions"):
        shown = ", ".join(str(tuple(p)) if len(p) > 1 else str(p[0]) for p in context["positions"])
        evidence.append(f"inside a batch row, the fully masked softmax rows are at index {shown} "
                        f"(after the batch axis: heads, queries)")
    mask_op = context.get("fill") or {}
    if mask_op.get("source"):
        evidence.append(f"the masked values come from {mask_op['op']} at {mask_op['source']}")
    dtype = (first.inputs or {}).get("dtype", "float32")
    fill = MASK_FILL.get(dtype, DEFAULT_MASK_FILL)
    lines = [f"# {mask_op['source']}: the mask" if mask_op.get("source") else None,
             f"# {first.source}: the softmax" if first.source else None,
             f"scores = tf.where(mask, scores, {fill:g})  # a finite fill, not -inf ({dtype})",
             "weights = tf.nn.softmax(scores, axis=-1)",
             "weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, 0.0)"
             "  # rows with no valid position give 0"]
    fix = "\n".join(line for line in lines if line)
    data = {**_data(first, first.inputs or {}), "masked_rows": masked, "softmax_rows": total,
            "batch_rows": batch_rows, "fill": fill}
    if dataset_rows is not None:
        data["dataset_rows"] = [dataset_rows[i] for i in batch_rows if i < len(dataset_rows)]
    return recommend("masked-softmax", "error", evidence, fix, data)


def _double_where(first, where, inputs, context):
    forward_op = inputs.get("op") or first.op
    select = context["discarded_by"]
    at = f" at {select['source']}" if select.get("source") else ""
    thrown = context.get("forward_nonfinite")
    evidence = [f"{where}: the gradient of {forward_op} is not finite, though the forward value of that "
                f"{forward_op} was thrown away by a tf.where ({select['op']}{at})"
                + (f"; {thrown} of its forward values were non-finite" if thrown else ""),
                f"{forward_op} fed {_operand(inputs)}; the tf.where passes a zero gradient to the branch it did not "
                f"take, and 0 times the op's infinite local derivative is NaN"]
    guard = "count > 0" if forward_op in DIVISION_OPS else "x > 0"
    if forward_op in DIVISION_OPS:
        snippet = ("safe = tf.where(count > 0, count, 1.0)  # make the input safe inside the branch first\n"
                   "mean = tf.where(count > 0, total / safe, 0.0)")
    else:
        op_call = {"Log": "tf.math.log", "Sqrt": "tf.sqrt", "Rsqrt": "tf.math.rsqrt"}.get(forward_op, "f")
        snippet = (f"safe = tf.where({guard}, x, 1.0)  # make the input safe inside the branch first\n"
                   f"y = tf.where({guard}, {op_call}(safe), 0.0)")
    lines = [f"# {first.source}: the op" if first.source else None,
             f"# {select['source']}: the tf.where" if select.get("source") else None, snippet]
    data = {**_data(first, inputs), "discarded_by": select, "forward_nonfinite": thrown}
    return recommend("double-where", "error", evidence, "\n".join(line for line in lines if line), data)


def _dataset_rows(evidence, step):
    """The dataset rows of `step`'s batch, as ints, when the run knows its batch order."""
    if evidence.batch_rows is None:
        return None
    return [int(i) for i in evidence.batch_rows(step)]


def _listed(values, shown=8):
    return ", ".join(map(str, values[:shown])) + (" ..." if len(values) > shown else "")


def _stable_log(first, where, inputs):
    why = "log(0) = -inf and log(x<0) = NaN" if first.phase != "backward" else "the gradient 1/x overflows near x = 0"
    evidence = [f"{where}: {first.op} fed {_operand(inputs)}; {why}"]
    fix = _source_fix(first, "tf.math.log(tf.clip_by_value(p, 1e-7, 1.0))  # or tf.nn.log_softmax(logits), "
                             "or a Keras loss with from_logits=True")
    return recommend("stable-log", "error", evidence, fix, _data(first, inputs))


def _stable_exp(first, where, inputs):
    bound = EXP_OVERFLOW.get(inputs.get("dtype"), EXP_OVERFLOW["float32"])
    evidence = [f"{where}: {first.op} fed {_operand(inputs)}; exp overflows {inputs.get('dtype', 'float32')} "
                f"past {bound:.4g} (log of the dtype's max)"]
    clamp = EXP_CLAMP.get(inputs.get("dtype"), EXP_CLAMP["float32"])
    fix = _source_fix(first, "tf.nn.softplus(x)  # for log(1 + exp(x)); or tf.reduce_logsumexp, "
                             f"or tf.exp(tf.minimum(x, {clamp}))")
    return recommend("stable-exp", "error", evidence, fix, _data(first, inputs))


def _safe_division(first, where, inputs):
    evidence = [f"{where}: {first.op} fed {_operand(inputs)}; dividing by 0 gives inf or NaN"]
    fix = _source_fix(first, "a / (b + 1e-7)  # or tf.math.divide_no_nan(a, b); tf.math.rsqrt(v + 1e-7)")
    return recommend("safe-division", "error", evidence, fix, _data(first, inputs))


def _safe_sqrt(first, where, inputs):
    why = ("its gradient 0.5/sqrt(x) is infinite at x = 0" if first.phase == "backward"
           else "sqrt of a negative value is NaN")
    evidence = [f"{where}: {first.op} ({'gradient of Sqrt' if first.phase == 'backward' else 'Sqrt'}) fed "
                f"{_operand(inputs)}; {why}"]
    fix = _source_fix(first, "tf.sqrt(x + 1e-7)  # or tf.sqrt(tf.maximum(x, 1e-7))")
    return recommend("safe-sqrt", "error", evidence, fix, _data(first, inputs))


def _loss_scaling(report, first, where, inputs):
    from nanscope.rules.precision import overflow_rule

    evidence = [f"{where}: {first.op} overflowed float16 (largest finite value {FLOAT16_MAX:g}); "
                f"{_operand(inputs)}"]
    rule = overflow_rule(report)
    if rule == "float32-layer":
        evidence.append("a LossScaleOptimizer is already in use: loss scaling protects the gradients, not this value")
    return recommend(rule, "error", evidence, data=_data(first, inputs))


def _optimizer_epsilon(report, first, where, inputs):
    config = report.run.get("optimizer_config", {})
    epsilon = config.get("epsilon")
    evidence = [f"{where}: the gradients were finite but the update was not"
                + (f" ({first.op} fed {_operand(inputs)})" if first.op and inputs else "")]
    if epsilon is not None:
        evidence.append(f"optimizer epsilon {epsilon:g}" + (" underflows to 0 in float16" if epsilon < 6e-8 else ""))
    return recommend("optimizer-epsilon", "error", evidence, data={"step": first.step, "op": first.op,
                                                                   "epsilon": epsilon})


def _any_bad_grad(report):
    history = report.history
    if history is None:
        return False
    at = history.steps() == report.first_nonfinite.step
    return bool((history.column("grad_nonfinite")[at] != 0).any())
