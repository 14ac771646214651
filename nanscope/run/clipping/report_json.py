"""The `nanscope.clipping/1` JSON document of a ClippingReport."""

from nanscope.jsonio import jsonable

SCHEMA = "nanscope.clipping/1"


def clipping_json(report):
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


def _strategy_json(run):
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
