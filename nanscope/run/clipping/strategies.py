"""Clipping strategies: what `--strategies` names, parsed and validated once.

A strategy is one way of bounding the gradient before the update:

  none                          no clipping (the reference run)
  clipvalue[=V]                 Keras optimizer option: every element clipped to [-V, V]
  clipnorm[=C]                  Keras optimizer option: each variable's gradient to norm <= C (Keras 3: per variable)
  global_clipnorm[=C]           Keras optimizer option: all gradients together to global norm <= C
  manual_clip_by_norm[=C]       `tf.clip_by_norm` on each gradient in the train step, as custom loops do
  manual_clip_by_global_norm[=C]  `tf.clip_by_global_norm` on all gradients in the train step
  auto                          global norm clipped at a percentile of the unclipped run's healthy norms (AutoClip)

A strategy given without a threshold gets one derived from the unclipped run
(see `nanscope.run.clipping.thresholds`).

Example:
    parse_strategies("none,clipnorm=1,auto")
"""

import math
from dataclasses import dataclass
from typing import Any

from nanscope.errors import NanscopeError, did_you_mean

KERAS_MODES = ("clipvalue", "clipnorm", "global_clipnorm")
MANUAL_MODES = ("manual_clip_by_norm", "manual_clip_by_global_norm")
KINDS = ("none", *KERAS_MODES, *MANUAL_MODES, "auto")
DEFAULT_STRATEGIES = "none,clipvalue,clipnorm,global_clipnorm,auto"
# What each kind bounds: the element values, each variable's norm, or the global norm.
MEASURE = {
    "clipvalue": "max_abs", "clipnorm": "max_variable_norm", "manual_clip_by_norm": "max_variable_norm",
    "global_clipnorm": "global_norm", "manual_clip_by_global_norm": "global_norm", "auto": "global_norm",
}


class StrategyError(NanscopeError):
    """A `--strategies` entry that is not a known strategy or has a bad threshold."""


@dataclass
class Strategy:
    """One clipping strategy to compare.

    Args:
        kind: str. One of KINDS.
        threshold: float or None. None until derived from the unclipped run (or for `none`).
        threshold_source: str. How the threshold was chosen ("given", or the derivation).
    """

    kind: str
    threshold: float | None = None
    threshold_source: str = "given"

    @property
    def name(self) -> str:
        """The label in tables and JSON: "clipnorm=1", "auto", "none"."""
        if self.kind in ("none", "auto") or self.threshold is None:
            return self.kind
        return f"{self.kind}={self.threshold:g}"

    @property
    def is_keras_option(self) -> bool:
        """True when the clipping is the optimizer's own (clipvalue / clipnorm / global_clipnorm)."""
        return self.kind in KERAS_MODES

    @property
    def measure(self) -> str | None:
        """What the threshold bounds: "max_abs", "max_variable_norm" or "global_norm" (None for `none`)."""
        return MEASURE.get(self.kind)

    def params(self) -> dict[str, Any]:
        """The strategy's settings, for the report."""
        if self.kind == "none":
            return {}
        return {"mode": self.kind, "threshold": self.threshold, "threshold_source": self.threshold_source}


def parse_strategies(text: str | None, option: str = "--strategies") -> list[Strategy]:
    """The strategies named in a comma-separated list, in order, duplicates dropped.

    Raises:
        StrategyError: naming the option and the entry, with the nearest known name.
    """
    entries = [part.strip() for part in (text or DEFAULT_STRATEGIES).split(",")]
    strategies: list[Strategy] = []
    seen: set[str] = set()
    for entry in entries:
        if not entry:
            raise StrategyError(f"`{option}`: empty entry in {text!r}; expected e.g. {DEFAULT_STRATEGIES}")
        strategy = parse_strategy(entry, option)
        if strategy.name not in seen:
            seen.add(strategy.name)
            strategies.append(strategy)
    return strategies


def parse_strategy(entry: str, option: str = "--strategies") -> Strategy:
    """One `kind` or `kind=threshold` entry."""
    kind, sep, value = entry.partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS:
        hint = did_you_mean(kind, KINDS, cutoff=0.5) or f"; known: {', '.join(KINDS)}"
        raise StrategyError(f"`{option}`: unknown strategy {entry!r}{hint}")
    if not sep:
        return Strategy(kind)
    if kind in ("none", "auto"):
        raise StrategyError(f"`{option}`: {kind} takes no threshold. Received: {entry!r}")
    try:
        threshold = float(value)
    except ValueError:
        raise StrategyError(f"`{option}`: threshold of {kind} must be a number. Received: {entry!r}") from None
    if not math.isfinite(threshold) or threshold <= 0:
        raise StrategyError(f"`{option}`: `{kind}` must be > 0. Received: {entry}")
    return Strategy(kind, threshold)
