"""`nanscope replay DIR` on a fit bundle: the saved step, replayed op by op from the state before it.

The model is loaded with the user's code, the weights and optimizer state from before
the step are put back, and the model's own `train_step` runs eagerly on the saved batch
under the op watch the callback uses (`forensics.guest.replay_call`). The report names
the phase, the op, its layer and its source line, and the rule catalogue runs on it:
rules that need the run's history (gradient growth, update ratios) cannot fire from one
step; the data rules read the saved batch.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.engine.model_view import probed_layers
from nanscope.errors import NanscopeError, first_line
from nanscope.forensics.bundle_code import name_origins
from nanscope.forensics.replay import describe_event
from nanscope.keras.bundle_step import run_saved_step
from nanscope.keras.forensics import batch_lines, labelled_fit_batch
from nanscope.keras.header import compiled_loss_name, model_loss_name, precision
from nanscope.model.learning_rate import schedule_fields
from nanscope.model.optimizers import optimizer_settings
from nanscope.runtime import tensorflow
from nanscope.tf_types import Batch, KerasModel

if TYPE_CHECKING:
    from nanscope.keras.bundle_load import FitBundle
    from nanscope.report.model import TraceReport
    from nanscope.rules.evidence import RunEvidence



def replay_fit_bundle(directory: str | os.PathLike[str], document: dict[str, Any], arrays: Mapping[str, np.ndarray],
                      verify: bool = False, unsafe: bool = False) -> "TraceReport":
    """The TraceReport of a fit bundle's step replayed: first_nonfinite and recommendations (verified with `verify`).

    Raises:
        NanscopeError: the bundle is incomplete, its user code is gone or its model does not load.
    """
    from nanscope.keras.bundle_load import load_fit_repro, run_findings
    from nanscope.report.model import FirstNonfinite, TraceReport
    from nanscope.rules.diagnose import diagnose

    bundle = load_fit_repro(directory, document, arrays, unsafe)
    model, step = bundle.model, int(document["step"])
    report = TraceReport(run=_header(bundle, directory), layers=[], layer_order=[], variables=[])
    try:
        outcome = run_saved_step(bundle)
    except Exception as exc:  # the user's code, as loaded from the bundle, raised
        raise NanscopeError(f"{directory}: the saved step does not run from the bundle: {type(exc).__name__}: "
                            f"{first_line(exc)}", hint=_run_hint(exc)) from exc
    report.run["replay_seconds"] = outcome.seconds
    bad_rows = batch_lines(labelled_fit_batch(bundle.batch))
    if bad_rows:
        report.first_nonfinite = FirstNonfinite(step, "data", detail=bad_rows)
    elif outcome.event is not None:
        report.first_nonfinite = describe_event(FirstNonfinite(step, outcome.event.phase), outcome.event,
                                                loss_name=compiled_loss_name(bundle.model))
        name_origins(report.first_nonfinite, directory, document)
    else:
        report.notes.append(f"the replay of step {step} stayed finite (loss {outcome.loss:.6g}): a non-deterministic "
                            "op (dropout), or a value only the compiled step produced")
    report.notes.append("replayed from a fit bundle: one step, so the rules that need the run's history (gradient "
                        "growth, update ratios) cannot fire; the data rules read this step's batch only")
    report.recommendations = diagnose(report, batch_evidence(model, bundle.batch, report.run["loss"]))
    fired = {rec.id for rec in report.recommendations}
    for rec in run_findings(document, Path(directory) / "repro.json"):
        if rec.id not in fired:
            rec.evidence.append("from the fit run's report (this rule reads the whole run, not one step)")
            report.recommendations.append(rec)
    if verify:
        from nanscope.keras.bundle_verify import verify_saved_step

        verify_saved_step(bundle, report, outcome)
    return report


def _run_hint(exc: Exception) -> str | None:
    if isinstance(exc, NameError):
        return ("a Lambda layer's function is loaded from its bytecode with Keras' own globals, so the modules it "
                "names (tf, np) are not defined: import them inside it, or make it a layer class")
    return None


def _header(bundle: "FitBundle", directory: str | os.PathLike[str]) -> dict[str, Any]:
    model, document = bundle.model, bundle.document
    name, config = optimizer_settings(model.optimizer)
    return {"spec": None, "replay": str(directory), "kind": "fit", "step": document.get("step"),
            "epoch": document.get("epoch"), "model": f"{model.name} ({type(model).__name__})",
            "loss": model_loss_name(model), "optimizer": name, "optimizer_config": config,
            **schedule_fields(model.optimizer, document["step"]),  # replay_fit_bundle read it
            **precision(probed_layers(model), [model.optimizer]), "versions": document.get("versions"),
            "user_code": [f"{entry['qualname']} ({entry.get('origin') or entry['file']})"
                          for entry in document.get("user_code", [])]}


def batch_evidence(model: KerasModel, batch: Batch, loss: str) -> "RunEvidence":
    """RunEvidence from the saved batch alone: the model, its float inputs' and (one output's) targets' scales."""
    from nanscope.rules.evidence import RunEvidence, feature_scales, target_scales

    tf, keras = tensorflow()
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    evidence = RunEvidence(keras_model=model)
    x = tf.nest.map_structure(np.asarray, x)
    if isinstance(x, (np.ndarray, dict)) or (isinstance(x, (tuple, list)) and all(
            isinstance(part, np.ndarray) for part in x)):
        evidence.features = feature_scales(x if not isinstance(x, list) else tuple(x))
    if y is not None and tf.is_tensor(y):
        evidence.targets = target_scales([(None, loss, np.asarray(y))])
    return evidence
