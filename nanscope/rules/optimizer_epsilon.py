"""`optimizer-epsilon`: a non-finite update from finite gradients (Adam's epsilon underflowing in float16)."""

from typing import Any

from nanscope.model.learning_rate import inner_optimizer
from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.fixes import Bundle, Change, Session, StepFix, optimizer_setting
from nanscope.rules.operand import operand
from nanscope.rules.rule import Fixtures, Recommendation, Rule

OPTIMIZER_EPSILON = Rule(
    "optimizer-epsilon",
    "Raise the optimizer's epsilon",
    "A non-finite update from finite gradients (e.g. Adam's epsilon underflowing in float16).",
    "train:\n  optimizer: {epsilon: 1.0e-4}",
)
RULES = (OPTIMIZER_EPSILON,)
FIXTURES = Fixtures(fires=("adam-epsilon-zero-dead-relu",), quiet=("tabular-regression-adam",))
# Adam's default epsilon is 1e-7, which is 0 in float16; 1e-4 is representable and still small.
SAFE_EPSILON = 1e-4


def matches(facts: Facts, first: FirstNonfinite) -> bool:
    """True when the update went non-finite at a step whose gradients were all finite."""
    return first.phase == "update" and not _any_bad_grad(facts, first.step)


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a non-finite update from finite gradients."""
    epsilon = facts.run.get("optimizer_config", {}).get("epsilon")
    evidence = [f"{where}: the gradients were finite but the update was not"
                + (f" ({first.op} fed {operand(inputs)})" if first.op and inputs else "")]
    if epsilon is not None:
        evidence.append(f"optimizer epsilon {epsilon:g}" + (" underflows to 0 in float16" if epsilon < 6e-8 else ""))
    return OPTIMIZER_EPSILON.recommend("error", evidence, data={"step": first.step, "op": first.op,
                                                                "epsilon": epsilon})


def _any_bad_grad(facts: Facts, step: int) -> bool:
    steps = facts.steps
    if steps is None:
        return False
    at = steps["step"] == step
    return bool((steps["grad_nonfinite"][at] != 0).any())


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """The run again with epsilon at SAFE_EPSILON, for an optimizer that has one."""
    del rec, run  # Unused
    if "epsilon" not in _optimizer_arguments(session):
        return []
    return [Change(f"epsilon={SAFE_EPSILON:g}", {"epsilon": SAFE_EPSILON}, {"epsilon": SAFE_EPSILON})]


def _optimizer_arguments(session: Session) -> set[str]:
    spec = session.spec.train.optimizer
    if spec is None:
        return set()
    from nanscope.model.optimizers import build_optimizer

    return set(build_optimizer(session.spec, session.model).get_config())


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved step with epsilon at SAFE_EPSILON."""
    del rec, run  # Unused
    optimizer = bundle.model.optimizer
    if not hasattr(inner_optimizer(optimizer), "epsilon"):
        return []
    return [StepFix(f"epsilon={SAFE_EPSILON:g}", {"epsilon": SAFE_EPSILON},
                    change=optimizer_setting("epsilon", SAFE_EPSILON))]


