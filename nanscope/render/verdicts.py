"""The verdicts on the first non-finite step, as the report's panel shows them (`nanscope.guard.verdicts` makes them).

Under tf.distribute each names the replicas its re-run found non-finite, or says it stayed finite on every one.
"""

from collections.abc import Sequence
from typing import Any


def reproducible_text(first: Any) -> str | None:
    """"yes: non-finite again from the state before it on replica 1 (deterministic)", "no: ..."; None: not checked.

    Args:
        first: FirstNonfinite (report.model, a layer up).
    """
    if first.reproducible is None:
        return None
    if first.reproducible:
        return f"yes: non-finite again from the state before it{_on(first.reproducible_replicas)} (deterministic)"
    return (f"no: finite from the state before it{_on(first.reproducible_replicas, finite=True)} (nondeterminism "
            "or a transient fault)")


def origin_text(first: Any) -> str | None:
    """"batch: non-finite from an earlier state too (the data)", "state: ..."; None: not checked.

    Args:
        first: FirstNonfinite (report.model, a layer up).
    """
    if first.origin is None:
        return None
    if first.origin == "batch":
        return f"batch: non-finite from an earlier state too{_on(first.origin_replicas)} (the data)"
    return f"state: finite from an earlier state{_on(first.origin_replicas, finite=True)} (the model's state drifted)"


def _on(replicas: Sequence[int] | None, finite: bool = False) -> str:
    """" on replica 1", " on replicas 0, 1"; for a finite re-run " on every replica"; "" on one device, or where a
    non-finite re-run shows no replica's own count (the shared weights' update)."""
    if replicas is None or (not replicas and not finite):
        return ""
    if finite:
        return " on every replica"
    return f" on replica{'s' if len(replicas) > 1 else ''} {', '.join(map(str, replicas))}"
