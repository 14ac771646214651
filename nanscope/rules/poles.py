"""`avoid-poles`: lgamma, digamma, xlogy or log1p at a pole, as Poisson, negative-binomial, Beta and Dirichlet
losses reach when a rate or a concentration comes straight from a relu (0), or log1p gets a prediction below -1."""

from typing import Any

from nanscope.rules.domains import measured
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

AVOID_POLES = Rule(
    "avoid-poles",
    "Keep lgamma, digamma, xlogy and log1p off their poles",
    "An Lgamma or Digamma fed 0 or a negative integer, an Xlogy whose log argument is 0 where its factor is not, "
    "or a Log1p fed values at or below -1: the distribution's parameter left its domain.",
    "rate = tf.nn.softplus(raw) + 1e-6  # a positive parameter from an unconstrained output, not relu\n"
    "# or an exp link: rate = tf.exp(raw); log1p of a prediction: tf.math.log1p(tf.nn.softplus(y_pred))",
)
RULES = (AVOID_POLES,)
FIXTURES = Fixtures(fires=("negative-binomial-relu-dispersion", "poisson-relu-rate", "rmsle-linear-head"),
                    quiet=("negative-binomial-softplus-dispersion", "poisson-softplus-rate", "rmsle-softplus-head"))
OPS = {"Lgamma", "Digamma", "Xlogy", "Xlog1py", "Log1p"}
WHY = {
    "Lgamma": "lgamma has a pole (+inf) at 0 and at every negative integer",
    "Digamma": "digamma has a pole at 0 and at every negative integer",
    "Xlogy": "xlogy(x, y) = x * log(y) is -inf where y = 0 and x != 0, and NaN where y < 0",
    "Xlog1py": "xlog1py(x, y) = x * log1p(y) is -inf at y = -1 and NaN below it",
    "Log1p": "log1p(x) is -inf at x = -1 and NaN below it",
}
SNIPPETS = {
    "Lgamma": "r = tf.nn.softplus(raw) + 1e-6  # the parameter lgamma takes, kept > 0 (not relu)",
    "Digamma": "r = tf.nn.softplus(raw) + 1e-6  # the parameter digamma takes, kept > 0 (not relu)",
    "Xlogy": "rate = tf.nn.softplus(raw) + 1e-6  # or tf.exp(raw): the Poisson rate kept > 0 (not relu)",
    "Xlog1py": "y = tf.nn.softplus(raw) - 1.0 + 1e-6  # kept > -1",
    "Log1p": "tf.math.log1p(tf.nn.softplus(y_pred))  # a prediction kept > -1 (softplus output)",
}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a producer with poles: Lgamma, Digamma, Xlogy, Xlog1py, Log1p."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for an op at one of its poles."""
    del facts  # Unused
    op, name, domain = measured(first, inputs)
    assert op is not None  # `matches` took the producer for one of OPS
    evidence = [f"{where}: {name} fed {operand(inputs)}; {WHY[op]} ({domain})"]
    return AVOID_POLES.recommend("error", evidence, source_fix(first, SNIPPETS[op]), finding_data(first, inputs))
