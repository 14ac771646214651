"""One central table of rules, keyed by stable kebab-case ids.

A rule says what it detects, its title and its default fix. A detector that finds
evidence for a rule calls `recommend(rule_id, ...)`, which returns a
`Recommendation`: the rule's id and title plus the evidence measured in this run.
"""

from dataclasses import dataclass, field
from typing import Optional

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Rule:
    """One diagnosis nanscope can make.

    Args:
        id: str. Stable kebab-case id; users and tests depend on it.
        title: str. What to do, as an imperative ("Lower the learning rate").
        detects: str. One sentence: the evidence that triggers it.
        fix: str. The default fix, as a YAML or code snippet.
    """

    id: str
    title: str
    detects: str
    fix: str


@dataclass
class Recommendation:
    """A rule that fired in this run, with the evidence it cites.

    Args:
        id: str. The rule id.
        title: str. The rule title.
        severity: str. "error", "warning" or "info".
        evidence: list of str. Measured facts, each one line ("step 12: grad norm 3.1e+05").
        fix: str. The concrete fix for this run (a YAML/code snippet with computed values).
        verified: bool or None. Whether a re-run with the fix applied stayed finite (None: not tried).
        data: dict. Machine-readable evidence (values the message cites).
    """

    id: str
    title: str
    severity: str
    evidence: list
    fix: str
    verified: Optional[bool] = None
    data: dict = field(default_factory=dict)


RULES = {
    rule.id: rule
    for rule in (
        Rule(
            "clean-input-data",
            "Remove or impute the non-finite values in the input data",
            "NaN or Inf values in the batch fed to the model (phase `data`).",
            "x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # or drop the rows: x[np.isfinite(x).all(axis=1)]",
        ),
        Rule(
            "normalize-inputs",
            "Normalize the input features",
            "Input features far from unit scale.",
            "norm = keras.layers.Normalization(); norm.adapt(x)  # first layer of the model",
        ),
        Rule(
            "normalize-targets",
            "Scale the regression targets",
            "Regression targets with a large scale under an MSE-like loss.",
            "y_mean, y_std = y.mean(0), y.std(0); y = (y - y_mean) / y_std  # invert on predictions",
        ),
        Rule(
            "lower-learning-rate",
            "Lower the learning rate",
            "Update ratio |dw|/|w| far above ~1e-3, or loss and gradient norm growing geometrically from the start.",
            "train:\n  optimizer: {learning_rate: 0.001}",
        ),
        Rule(
            "clip-gradients",
            "Clip the gradients",
            "Gradient norm spikes or geometric growth of the gradient norm.",
            "train:\n  optimizer: {global_clipnorm: 1.0}",
        ),
    )
}


def recommend(rule_id, severity, evidence, fix=None, data=None):
    """A Recommendation for `rule_id` with this run's evidence; `fix` defaults to the rule's."""
    rule = RULES[rule_id]
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}. Received: severity={severity!r}")
    return Recommendation(rule.id, rule.title, severity, list(evidence), fix or rule.fix, None, dict(data or {}))
