"""Save what a replay of one step needs, and replay it later: `trace-steps --save-repro DIR`, `nanscope replay DIR`.

A repro folder holds `repro.json` (schema, step, the validated spec with its files
named relative to the folder, and the spec file's name), `state.npz` (the model's and
the optimizer's variables as they were before the step, and the batch) and copies of
the files the spec references (`code/`, `model/`, `data/`: `forensics.spec_files`), so
it replays on another machine from the folder alone.

Two kinds share the schema: `"kind": "spec"` (written by trace-steps, replayed through
the spec) and `"kind": "fit"` (written by `NanScope(repro=DIR)` inside a user's `fit`,
with the saved model: `nanscope.keras.bundle`). A folder without `kind` is a spec bundle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nanscope.data import inputs, targets
from nanscope.errors import NanscopeError, first_line
from nanscope.forensics.bundle_code import name_origins, origin_name
from nanscope.forensics.spec_files import bundle_spec
from nanscope.jsonio import write_text_atomic

if TYPE_CHECKING:
    from nanscope.report import TraceReport

SCHEMA = "nanscope.repro/1"


def save_repro(directory, session, step, x, y, state_before):
    """Write the repro of `step` to `directory` (created if needed).

    Args:
        directory: str or Path.
        session: Session the step ran in.
        step: int.
        x, y: np.ndarray. The step's batch (y: a tuple of arrays for a multi-output model; x: a mapping or a
            tuple of arrays for a model with several inputs).
        state_before: list of np.ndarray. Model then optimizer variables before the step.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"state_{i}": value for i, value in enumerate(state_before)}
    targets = {f"y_{i}": part for i, part in enumerate(y)} if isinstance(y, tuple) else {"y": y}
    batch = {f"x_{i}": part for i, part in enumerate(inputs.parts(x))} if inputs.is_multi(x) else {"x": x}
    np.savez(directory / "state.npz", rows=session.order.indices(step), **batch, **targets, **arrays)
    spec, code_files, not_copied = bundle_spec(session.spec, directory)
    document = {"schema": SCHEMA, "kind": "spec", "step": step,
                "spec_origin": origin_name(session.spec.source) if session.spec.source else None,
                "spec": spec, "code_files": code_files, "not_copied": not_copied, "variables": len(state_before),
                "inputs": list(x) if isinstance(x, dict) else len(x) if inputs.is_multi(x) else None}
    write_text_atomic(directory / "repro.json", json.dumps(document, indent=2) + "\n")
    return directory


def load_repro(directory):
    """(document, arrays) of a repro folder.

    Raises:
        NanscopeError: when the folder is not a nanscope repro.
    """
    directory = Path(directory)
    meta, state = directory / "repro.json", directory / "state.npz"
    if not meta.is_file() or not state.is_file():
        raise NanscopeError(f"{directory}: not a repro folder (expected repro.json and state.npz)",
                            hint="write one with `nanscope trace-steps SPEC --save-repro DIR` or "
                                 "`NanScope(repro=DIR)` in fit")
    try:
        document = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NanscopeError(f"{meta}: cannot read: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        received = document.get("schema") if isinstance(document, dict) else document
        raise NanscopeError(f"{meta}: `schema` must be {SCHEMA!r}. Received: schema={received!r}")
    if document.get("kind", "spec") not in ("spec", "fit"):
        raise NanscopeError(f"{meta}: `kind` must be 'spec' or 'fit'. Received: kind={document.get('kind')!r}")
    if not isinstance(document.get("step"), int):
        raise NanscopeError(f"{meta}: `step` must be an int. Received: step={document.get('step')!r}")
    try:
        with np.load(state, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError) as exc:
        raise NanscopeError(f"{state}: cannot read: {first_line(exc)}") from exc
    return document, arrays


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
        from nanscope.keras.bundle_replay import replay_fit_bundle

        return replay_fit_bundle(directory, document, arrays, verify=verify, unsafe=unsafe)
    if verify:
        raise NanscopeError(f"{directory}: --verify replays fit bundles (`NanScope(repro=DIR)`); this bundle was "
                            "written by trace-steps", hint="`nanscope trace-steps SPEC --verify` verifies each fix "
                            "over the whole run")
    return _replay_spec_bundle(directory, document, arrays, unsafe)


def _replay_spec_bundle(directory, document, arrays, unsafe=False):
    """The saved step run again as trace-steps ran it: its compiled step from the saved state (under the spec's
    precision and loss scaling), attributed by the same code, then replayed op by op."""
    from nanscope.attribution import describe_bad_batch
    from nanscope.forensics.replay import state_variables
    from nanscope.report import FirstNonfinite, TraceReport
    from nanscope.rules.diagnose import diagnose
    from nanscope.rules.evidence import evidence_from_session
    from nanscope.session import open_session
    from nanscope.spec import parse_spec
    from nanscope.trace import describe_run, locate_first_nonfinite  # the step runs as trace-steps runs it

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


def _saved_inputs(document, arrays):
    """The step's inputs as saved: one array, or a mapping (by input name) or a tuple, one array per input."""
    names = document.get("inputs")
    if names is None:
        return arrays["x"]
    if isinstance(names, list):
        return {name: arrays[f"x_{i}"] for i, name in enumerate(names)}
    return tuple(arrays[f"x_{i}"] for i in range(names))


def _finite(array):
    return not np.issubdtype(array.dtype, np.floating) or bool(np.isfinite(array).all())


def replay_document(report: TraceReport) -> dict:
    """The `nanscope.replay/1` JSON document of a replayed step."""
    from nanscope.jsonio import jsonable

    return jsonable({"schema": "nanscope.replay/1", "status": report.status, "run": report.run,
                     "first_nonfinite": report.first_nonfinite, "recommendations": report.recommendations,
                     "notes": report.notes})
