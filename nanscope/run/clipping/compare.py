"""compare-clipping: the same weights, the same batches, every clipping strategy.

`compare_clipping(spec, strategies)` opens one session (data loaded once, one set of
initial weights, one batch order) and trains it once per strategy through the one
experiment runner, `run_experiment`, which resets the weights before each run. The
unclipped run goes first: its healthy steps give the thresholds of strategies named
without one. Each run stops at its first non-finite step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nanscope.run.clipping.baseline import Baseline, trivial_baseline
from nanscope.run.clipping.effect import clip_overrides, step_effect, verify_optimizer_clip
from nanscope.run.clipping.result import ClippingReport, StrategyRun
from nanscope.run.clipping.strategies import Strategy, parse_strategies
from nanscope.run.clipping.thresholds import derive_thresholds
from nanscope.run.clipping.transforms import ClipMonitor
from nanscope import interrupt
from nanscope.run.experiment import Change, run_experiment
from nanscope.run.session import Session, open_session

if TYPE_CHECKING:
    from nanscope.spec.sections import RunSpec


def compare_clipping(spec: RunSpec, strategies: str | list[Strategy] | None = None, steps: int | None = None,
                     on_progress: Callable[[str, int, int], None] | None = None,
                     unsafe: bool = False) -> ClippingReport:
    """Train `spec` once per clipping strategy from the same start and pick the best.

    Args:
        spec: RunSpec. Already validated (overrides applied).
        strategies: str or list of Strategy, optional. Default: DEFAULT_STRATEGIES.
        steps: int, optional. Steps per strategy (default: `train.steps`).
        on_progress: callable(name, done, total), optional. Called after every step.
        unsafe: bool, default False. Allow `.keras` files that need unsafe deserialization.

    Returns:
        ClippingReport.

    Example:
        report = compare_clipping(load_spec("configs/exploding-regression.yaml"), "none,clipnorm=1", steps=200)
        report.recommended  # "clipnorm=1"
    """
    from nanscope.run.clipping.verdict import decide

    strategies = parse_strategies(strategies) if strategies is None or isinstance(strategies, str) else list(strategies)
    steps = steps or spec.train.steps
    session = open_session(spec, unsafe=unsafe)
    ordered, notes = _unclipped_first(strategies)
    baseline = _baseline(session, notes)
    progress = _Progress(on_progress, steps * len(ordered))
    runs: list[StrategyRun] = []
    thresholds: dict[str, Any] = {}
    interrupted = False
    try:
        for strategy in ordered:
            if strategy.kind != "none" and strategy.threshold is None:
                thresholds = derive_thresholds(ordered, runs[0].result, _learning_rate(spec, steps),
                                               session.model.param_count, session.initial_weight_norm())
            runs.append(_run_strategy(session, strategy, steps, progress))
    except KeyboardInterrupt:
        interrupted = True
        notes.append(f"interrupted: {len(runs)} of {len(ordered)} strategies finished; the verdict covers those")
    report = ClippingReport(run=_describe(session, steps), runs=runs, thresholds=thresholds, notes=notes,
                            interrupted=interrupted, baseline=baseline)
    with interrupt.deferred():
        decide(report)
    return report


def stopped_before_training(spec_source: str | os.PathLike,
                            strategies: list[Strategy] | None = None) -> ClippingReport:
    """The report of a comparison that a signal stopped during start-up, before any strategy trained."""
    names = [s.name for s in strategies] if strategies else []
    note = "interrupted during start-up (loading the spec, the data or the model): 0 of " \
           f"{len(names)} strategies finished" + (f" ({', '.join(names)})" if names else "")
    return ClippingReport(run={"spec": str(spec_source)}, runs=[], thresholds={}, notes=[note], interrupted=True)


def _baseline(session: Session, notes: list[str]) -> Baseline | None:
    """The trivial baseline, or None with a note: a loss nanscope has no constant for is compared without one."""
    try:
        baseline = trivial_baseline(session)
    except Exception as exc:  # a baseline is evidence, not a reason to stop the comparison
        notes.append(f"no trivial baseline: computing it failed ({type(exc).__name__}); strategies are ranked "
                     "without it")
        return None
    if baseline is None:
        notes.append(f"no trivial baseline for the loss {session.loss.name!r}: strategies that stay finite are "
                     "ranked without checking that they learn")
    return baseline


def _unclipped_first(strategies: list[Strategy]) -> tuple[list[Strategy], list[str]]:
    """The strategies with `none` first; `none` is added when a threshold must be derived from it."""
    nones = [s for s in strategies if s.kind == "none"]
    others = [s for s in strategies if s.kind != "none"]
    notes: list[str] = []
    if not nones and any(s.threshold is None for s in others):
        nones = [Strategy("none")]
        notes.append("added the unclipped run `none`: thresholds not given are derived from its healthy steps")
    return nones + others, notes


def _run_strategy(session: Session, strategy: Strategy, steps: int, progress: _Progress) -> StrategyRun:
    check = verify_optimizer_clip(session, strategy) if strategy.is_keras_option else None
    monitor = ClipMonitor(strategy, steps) if strategy.kind != "none" else None
    change = Change(
        name=strategy.name, params=strategy.params(), grad_transform=monitor,
        optimizer_overrides=clip_overrides(strategy.kind if strategy.is_keras_option else None, strategy.threshold),
    )
    result = run_experiment(session, change, steps=steps, on_step=lambda _record: progress.step(strategy.name),
                            fingerprint=True)
    progress.finish(strategy.name, steps - result.steps_run)
    finite_steps = result.first_nonfinite_step if result.first_nonfinite_step is not None else result.steps_run
    stats = monitor.read(result.steps_run) if monitor is not None else None
    skipped = result.history.column("update_skipped") != 0
    return StrategyRun(
        strategy=strategy, result=result, effect=step_effect(strategy, stats, finite_steps, skipped),
        optimizer_check=check,
    )


def _learning_rate(spec: RunSpec, steps: int) -> float | None:
    """The learning rate a clip threshold is bounded with: the spec's, or under a schedule its peak over the run
    (a threshold that keeps the largest step in bounds keeps every step in bounds)."""
    optimizer = spec.train.optimizer
    rate = optimizer.learning_rate if optimizer is not None else None
    if rate is not None and not isinstance(rate, float):
        from nanscope.model.learning_rate import peak_learning_rate
        from nanscope.model.optimizers import build_schedule

        return peak_learning_rate(build_schedule(spec, rate), steps)
    return rate if rate else (0.01 if optimizer is not None and optimizer.name.lower() == "sgd" else None)


def _describe(session: Session, steps: int) -> dict[str, Any]:
    spec = session.spec
    optimizer = spec.train.optimizer
    return {
        "spec": spec.source, "model": session.model.description, "parameters": session.model.param_count,
        "train_rows": session.train.rows, "validation_rows": session.validation.rows if session.validation else 0,
        "batch_size": spec.data.batch_size, "loss": session.loss.name,
        "optimizer": optimizer.model_dump() if optimizer is not None else "from the compiled model",
        "steps": steps, "seed": spec.train.seed, "mixed_precision": spec.train.mixed_precision,
        "loss_scaling": session.scales_loss,
    }


class _Progress:
    def __init__(self, callback: Callable[[str, int, int], None] | None, total: int) -> None:
        self.callback, self.total, self.done = callback, total, 0

    def step(self, name: str, count: int = 1) -> None:
        self.done += count
        if self.callback is not None:
            self.callback(name, self.done, self.total)

    def finish(self, name: str, remaining: int) -> None:
        if remaining > 0:
            self.step(name, remaining)
