"""`nanscope replay DIR`: a saved step run again, with the full localization, from a repro folder of either kind.

A spec bundle (`trace-steps --save-repro`) runs as trace-steps ran it, through its spec;
a fit bundle (`NanScope(repro=DIR)`) loads the saved model (`keras.bundle_replay`). Saving
and reading a folder is `forensics.repro`'s; this module sits above both trace-steps and
the Keras guest, which it calls.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.run.attribution import describe_bad_batch
from nanscope.data import inputs, targets
from nanscope.errors import NanscopeError
from nanscope.forensics.bundle_code import name_origins
from nanscope.forensics.replay import state_variables
from nanscope.forensics.repro import load_repro
from nanscope.jsonio import jsonable
from nanscope.keras.bundle_replay import replay_fit_bundle
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.rules.diagnose import diagnose
from nanscope.rules.evidence import evidence_from_session
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec
from nanscope.run.describe import describe_run  # the step runs as trace-steps runs it
from nanscope.run.locate import locate_first_nonfinite


def replay_repro(directory: str | os.PathLike, verify: bool = False, unsafe: bool = False) -> TraceReport:
    """Re-run the saved step with the full localization; a TraceReport with its first_nonfinite and findings.

    Args:
        directory: str or Path. A repro folder of either kind.
        verify: bool, default False. Also try each fix nanscope can apply on the saved step
            (`nanscope.keras.bundle_verify`; fit bundles only).
        unsafe: bool, default False. Load a model that needs Keras' unsafe deserialization (a Lambda layer).
    """
    document, arrays = load_repro(directory)
    if document.get("kind") == "fit":
        return replay_fit_bundle(directory, document, arrays, verify=verify, unsafe=unsafe)
    if verify:
        raise NanscopeError(f"{directory}: --verify replays fit bundles (`NanScope(repro=DIR)`); this bundle was "
                            "written by trace-steps", hint="`nanscope trace-steps SPEC --verify` verifies each fix "
                            "over the whole run")
    return _replay_spec_bundle(directory, document, arrays, unsafe)


def _replay_spec_bundle(directory: str | os.PathLike[str], document: dict[str, Any], arrays: Mapping[str, np.ndarray],
                        unsafe: bool = False) -> TraceReport:
    """The saved step run again as trace-steps ran it: its compiled step from the saved state (under the spec's
    precision and loss scaling), attributed by the same code, then replayed op by op."""
    # A bundle's spec names its files relative to the bundle (an older one: relative to `spec_source`).
    spec = parse_spec(document["spec"], source=document.get("spec_source") or str(Path(directory) / "repro.json"))
    session = open_session(spec, unsafe=unsafe)
    engine = session.instrumented_step()
    variables = state_variables(engine.model, engine.optimizer)
    if len(variables) != document.get("variables"):
        raise NanscopeError(f"{directory}: the repro holds {document.get('variables')} variables, "
                            f"the spec's model and optimizer have {len(variables)}; did the model change?")
    for i, variable in enumerate(variables):
        variable.assign(arrays[f"state_{i}"])
    x, step = _saved_inputs(document, arrays), int(document["step"])
    y = arrays["y"] if "y" in arrays else tuple(arrays[f"y_{i}"] for i in range(len(session.loss.outputs)))
    report = TraceReport(run={**describe_run(session, engine), "replay": str(directory)}, layers=[], layer_order=[],
                         variables=[])
    report.run["spec"] = document.get("spec_origin") or report.run["spec"]
    if not all(_finite(part) for part in [*inputs.parts(x), *targets.parts(y)]):
        report.first_nonfinite = FirstNonfinite(step, "data", detail=describe_bad_batch(
            x, y, arrays["rows"], session.train.feature_names, session.train.target_names,
            [o.name for o in session.loss.outputs]))
    else:
        record = engine.run(step, x, y)
        if record.phase is None:
            report.notes.append(f"the replay of step {step} stayed finite (a non-deterministic op, e.g. dropout?)")
        else:
            report.first_nonfinite = locate_first_nonfinite(record, engine, session, x, y)
            name_origins(report.first_nonfinite, directory, document)
    report.recommendations = diagnose(report, evidence_from_session(session))
    return report


def _saved_inputs(document: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """The step's inputs as saved: one array, or a mapping (by input name) or a tuple, one array per input."""
    names = document.get("inputs")
    if names is None:
        return arrays["x"]
    if isinstance(names, list):
        return {name: arrays[f"x_{i}"] for i, name in enumerate(names)}
    return tuple(arrays[f"x_{i}"] for i in range(names))


def _finite(array: np.ndarray) -> bool:
    return not np.issubdtype(array.dtype, np.floating) or bool(np.isfinite(array).all())


def replay_document(report: TraceReport) -> dict:
    """The `nanscope.replay/1` JSON document of a replayed step."""
    return jsonable({"schema": "nanscope.replay/1", "status": report.status, "run": report.run,
                     "first_nonfinite": report.first_nonfinite, "recommendations": report.recommendations,
                     "notes": report.notes})
