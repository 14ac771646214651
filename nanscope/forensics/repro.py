"""Save what a replay of one step needs, and replay it later: `trace-steps --save-repro DIR`, `nanscope replay DIR`.

A repro folder holds `repro.json` (schema, step, the validated spec with its files
named relative to the folder, and the spec file's name), `state.npz` (the model's and
the optimizer's variables as they were before the step, and the batch) and copies of
the files the spec references (`code/`, `model/`, `data/`: `forensics.spec_files`), so
it replays on another machine from the folder alone. Replaying one is `nanscope.replay`'s.

Two kinds share the schema: `"kind": "spec"` (written by trace-steps, replayed through
the spec) and `"kind": "fit"` (written by `NanScope(repro=DIR)` inside a user's `fit`,
with the saved model: `nanscope.keras.bundle`). A folder without `kind` is a spec bundle.
"""

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nanscope.data import inputs
from nanscope.errors import NanscopeError, first_line
from nanscope.forensics.bundle_code import origin_name
from nanscope.forensics.spec_files import bundle_spec
from nanscope.jsonio import write_text_atomic

if TYPE_CHECKING:
    from nanscope.data.batches import BatchOrder
    from nanscope.spec.sections import RunSpec

SCHEMA = "nanscope.repro/1"


class _Session(Protocol):
    """The session a step ran in, as far as its repro needs it (run.session.Session, a layer up)."""

    @property
    def spec(self) -> "RunSpec": ...

    @property
    def order(self) -> "BatchOrder": ...


def save_repro(directory: str | os.PathLike[str], session: _Session, step: int, x: Any, y: Any,
               state_before: list[np.ndarray]) -> Path:
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
    members: dict[str, Any] = {"rows": session.order.indices(step), **batch, **targets, **arrays}
    np.savez(directory / "state.npz", **members)
    spec, code_files, not_copied = bundle_spec(session.spec, directory)
    document = {"schema": SCHEMA, "kind": "spec", "step": step,
                "spec_origin": origin_name(session.spec.source) if session.spec.source else None,
                "spec": spec, "code_files": code_files, "not_copied": not_copied, "variables": len(state_before),
                "inputs": list(x) if isinstance(x, dict) else len(x) if inputs.is_multi(x) else None}
    write_text_atomic(directory / "repro.json", json.dumps(document, indent=2) + "\n")
    return directory


def load_repro(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
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
