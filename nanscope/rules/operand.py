"""How the op rules cite the producing op: where it ran, and the statistics of its operand.

The forensic replay (`forensics/watch.py`) names the op that produced the first non-finite
value and measures its operand (`FirstNonfinite.inputs`: op, dtype, operand name, min, max,
the zero and negative fractions); every op rule words its evidence with these helpers.
"""

from collections.abc import Sequence
from typing import Any

from nanscope.rules.facts import FirstNonfinite


def where(first: FirstNonfinite) -> str:
    """"step 3, forward pass, layer exp (ExpFeatures), models.py:12": where the first non-finite value appeared."""
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


def operand(inputs: dict[str, Any]) -> str:
    """"input min 0, max 3, 12.5% zeros, 0.0% negative": the op's operand statistics, as measured."""
    return (f"{inputs.get('operand', 'input')} min {inputs.get('min', float('nan')):.4g}, "
            f"max {inputs.get('max', float('nan')):.4g}, {inputs.get('zero_fraction', 0.0):.1%} zeros, "
            f"{inputs.get('negative_fraction', 0.0):.1%} negative")


def source_fix(first: FirstNonfinite, snippet: str) -> str:
    """`snippet` headed by the source line to change, where the op's line is known."""
    return f"# {first.source}: change this line\n{snippet}" if first.source else snippet


def finding_data(first: FirstNonfinite, inputs: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable evidence every op finding carries: step, op, layer, source and the operand's statistics."""
    return {"step": first.step, "op": first.op, "layer": first.layer, "source": first.source, **inputs}


def listed(values: Sequence[object], shown: int = 8) -> str:
    """The first `shown` values, comma-separated, with " ..." when there are more."""
    return ", ".join(map(str, values[:shown])) + (" ..." if len(values) > shown else "")
