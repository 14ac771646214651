"""What compare-clipping found: each strategy's run, the report, and its `nanscope.clipping/1` JSON document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nanscope.errors import EXIT_INTERRUPTED
from nanscope.jsonio import jsonable
from nanscope.run.clipping.baseline import Baseline
from nanscope.run.clipping.effect import OptimizerCheck, StepEffect
from nanscope.run.clipping.strategies import Strategy
from nanscope.run.experiment import ExperimentResult

SCHEMA = "nanscope.clipping/1"


@dataclass
class StrategyRun:
    """One strategy's run and what was measured about its clipping.

    Args:
        strategy: Strategy.
        result: ExperimentResult.
        effect: StepEffect. How often the threshold bit and how much norm it removed.
        optimizer_check: OptimizerCheck or None. First-step check of a Keras optimizer option.
    """

    strategy: Strategy
    result: ExperimentResult
    effect: StepEffect
    optimizer_check: OptimizerCheck | None = None

    @property
    def took_effect(self) -> bool | None:
        """False when clipping demonstrably did not act; None when there was nothing to check."""
        if self.optimizer_check is not None and self.optimizer_check.verified is False:
            return False
        return self.effect.took_effect


@dataclass
class ClippingReport:
    """Everything compare-clipping found. `to_json()` gives the `nanscope.clipping/1` document.

    Args:
        run: dict. Spec, model, optimizer and steps of the comparison.
        runs: list of StrategyRun, in the order run.
        thresholds: dict. How thresholds left open were derived.
        recommended: str or None. Name of the recommended strategy.
        recommendations: list of dict. Every strategy that stayed finite, best first, with why and the fix.
        diagnosis: str or None. Why no strategy helps, when none does.
        baseline: Baseline or None. The loss of the trivial constant prediction a strategy must beat.
        hides_problem: bool. Some strategy stayed finite but none beat the baseline: clipping only hides it.
    """

    run: dict[str, Any]
    runs: list[StrategyRun]
    thresholds: dict[str, Any]
    recommended: str | None = None
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    diagnosis: str | None = None
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    baseline: Baseline | None = None
    hides_problem: bool = False

    def exit_code(self) -> int:
        """0 when a strategy is recommended, 1 when none is, 130 when a signal cut the comparison short."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 0 if self.recommended is not None else 1

    def to_json(self) -> dict[str, Any]:
        return clipping_json(self)


def clipping_json(report: ClippingReport) -> Any:
    """The report as plain JSON types (NaN/Inf as strings)."""
    return jsonable({
        "schema": SCHEMA,
        "run": report.run,
        "thresholds": report.thresholds,
        "strategies": [_strategy_json(run) for run in report.runs],
        "recommended": report.recommended,
        "recommendations": report.recommendations,
        "diagnosis": report.diagnosis,
        "baseline": report.baseline.to_json() if report.baseline is not None else None,
        "hides_problem": report.hides_problem,
        "interrupted": report.interrupted,
        "notes": report.notes,
    })


def _strategy_json(run: StrategyRun) -> dict[str, Any]:
    result, effect, check = run.result, run.effect, run.optimizer_check
    return {
        "name": run.strategy.name,
        "params": run.strategy.params(),
        "first_nonfinite_step": result.first_nonfinite_step,
        "first_nonfinite_phase": result.first_nonfinite_phase,
        "steps_run": result.steps_run,
        "skipped_updates": result.skipped_updates,
        "stalled": result.stalled,
        "final_loss": result.final_loss,
        "best_loss": result.best_loss,
        "val_loss": result.val_loss,
        "clipped_fraction": effect.clipped_fraction,
        "norm_removed": effect.norm_removed,
        "clip_effect": {
            "took_effect": run.took_effect,
            "steps_bit": effect.steps_bit,
            "steps_within_threshold": effect.steps_within,
            "optimizer_check": None if check is None else {
                "verified": check.verified, "ignored": check.ignored, "max_update_error": check.max_error,
                "gradient_scale": check.gradient_scale, "detail": check.detail,
            },
        },
        "start_fingerprint": result.start_fingerprint,
        "batches_fingerprint": result.batches_fingerprint,
        "losses": result.losses,
        "grad_global_norms": result.grad_global_norms,
    }
