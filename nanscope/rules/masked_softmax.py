"""`masked-softmax`: a softmax over a row masked at every position (0/0 = NaN)."""

import numpy as np

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, listed
from nanscope.rules.rule import Fixtures, Recommendation, Rule

MASKED_SOFTMAX = Rule(
    "masked-softmax",
    "Fill masked positions with a finite value and zero the rows with nothing to attend to",
    "A softmax over a row masked at every position (a -inf fill, an additive -inf mask, or a hand-written "
    "exp(x) * mask / sum) gives 0/0 = NaN.",
    "scores = tf.where(mask, scores, -1e9)  # float16: half the dtype's minimum, -32752\n"
    "weights = tf.nn.softmax(scores, axis=-1)\n"
    "weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, 0.0)",
)
RULES = (MASKED_SOFTMAX,)
FIXTURES = Fixtures(fires=("attention-row-fully-masked",), quiet=("attention-partial-masks",))

# A masked position's fill: finite, so a row with no valid position stays finite, and far below any
# score. Half the dtype's most negative value, so that adding a score to it cannot overflow; float32
# and bfloat16 take the usual -1e9, which is far inside their range.
MASK_FILL = {"float16": float(np.finfo(np.float16).min) / 2}
DEFAULT_MASK_FILL = -1e9


def matches(first: FirstNonfinite) -> bool:
    """True when the replay found fully masked softmax rows around the producing op."""
    return bool((first.context or {}).get("masked_rows"))


def finding(facts: Facts, first: FirstNonfinite, where: str) -> Recommendation:
    """The Recommendation for a softmax whose rows were masked at every position."""
    context = first.context or {}
    dataset_rows = _dataset_rows(facts, first.step)
    masked, total, batch_rows = context["masked_rows"], context["softmax_rows"], context.get("batch_rows", [])
    evidence = [f"{where}: {first.op} turned {masked} of {total} softmax rows into NaN: every position of those "
                f"rows is masked, and a softmax over no position is 0/0"]
    if batch_rows:
        rows = [dataset_rows[i] for i in batch_rows if i < len(dataset_rows)] if dataset_rows is not None else []
        evidence.append(f"fully masked in {len(batch_rows)} batch row(s): {listed(batch_rows)}"
                        + (f" (dataset rows {listed(rows)})" if rows else "")
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
    data = {**finding_data(first, first.inputs or {}), "masked_rows": masked, "softmax_rows": total,
            "batch_rows": batch_rows, "fill": fill}
    if dataset_rows is not None:
        data["dataset_rows"] = [dataset_rows[i] for i in batch_rows if i < len(dataset_rows)]
    return MASKED_SOFTMAX.recommend("error", evidence, fix, data)


def _dataset_rows(facts: Facts, step: int) -> list[int] | None:
    """The dataset rows of `step`'s batch, as ints, when the run knows its batch order."""
    if facts.batch_rows is None:
        return None
    return [int(i) for i in facts.batch_rows(step)]
