"""Reading a run spec: the YAML file validated once into its sections, each error one line naming the file,
the field and the value received; the command line's overrides applied and validated again.

Example:
    spec = load_spec("configs/exploding-regression.yaml")
    spec = apply_overrides(spec, steps=300, learning_rate=1e-3)
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nanscope.errors import SpecError, did_you_mean
from nanscope.spec.sections import OptimizerSpec, RunSpec


def load_spec(path: str | os.PathLike) -> RunSpec:
    """Read and validate a YAML run spec.

    Args:
        path: str or Path. The spec file.

    Returns:
        RunSpec, with `source` set to `path`.

    Raises:
        SpecError: naming the file, the field and the value received.
    """
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: file not found")
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, expected a YAML run spec file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from exc
    except (ValueError, OverflowError, RecursionError) as exc:  # a scalar YAML resolves but cannot build (2001-02-30)
        raise SpecError(f"{path}: not valid YAML: {type(exc).__name__}: {exc}") from exc
    return parse_spec(document, source=str(path))


def parse_spec(document: dict, source: str = "<spec>") -> RunSpec:
    """Validate an already-parsed YAML document into a RunSpec.

    Raises:
        SpecError: for anything that is not a valid spec.
    """
    if document is None:
        raise SpecError(f"{source}: the spec is empty; expected a mapping with `model`, `data` and `train`")
    if not isinstance(document, dict):
        raise SpecError(
            f"{source}: the spec must be a mapping with `model`, `data` and `train`. "
            f"Received: a {type(document).__name__}"
        )
    try:
        spec = RunSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecError(f"{source}: {describe_validation_error(exc, RunSpec)}") from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise SpecError(f"{source}: invalid spec: {exc}") from exc
    spec.source = source
    return spec


def apply_overrides(spec: RunSpec, steps: int | None = None, learning_rate: float | None = None,
                    batch_size: int | None = None, seed: int | None = None) -> RunSpec:
    """Return a copy of `spec` with the CLI's overrides applied (None leaves a field as is).

    Raises:
        SpecError: when an override is out of range.
    """
    spec = spec.model_copy(deep=True)
    try:
        if steps is not None:
            spec.train.steps = steps
        if seed is not None:
            spec.train.seed = seed
        if batch_size is not None:
            spec.data.batch_size = batch_size
        if learning_rate is not None:
            spec.train.optimizer = (spec.train.optimizer or OptimizerSpec()).model_copy(
                update={"learning_rate": learning_rate}
            )
            OptimizerSpec.model_validate(spec.train.optimizer.model_dump())
    except ValidationError as exc:
        error = exc.errors()[0]
        # The first location part that names an override: a union (a rate or a schedule) adds its member's tag after it.
        option = next((OVERRIDE_OPTIONS[str(part)] for part in error["loc"] if str(part) in OVERRIDE_OPTIONS),
                      "command line")
        message = error["msg"].removeprefix("Value error, ")
        raise SpecError(f"{spec.source}: {option}: {message}. Received: {option} {error.get('input')!r}") from exc
    return spec


OVERRIDE_OPTIONS = {"steps": "--steps", "seed": "--seed", "batch_size": "--batch-size", "learning_rate": "--lr"}


def describe_validation_error(exc: ValidationError, root_model: type[BaseModel]) -> str:
    """One readable line for a pydantic ValidationError: field, problem, value received."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"] if not _is_union_tag(part)]
    field = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"unknown field `{field}`" + _did_you_mean(root_model, error["loc"])
    if error["type"] == "missing":
        return f"missing field `{field}`"
    message = error["msg"].removeprefix("Value error, ")
    received = error.get("input")
    shown = "" if isinstance(received, dict) else f". Received: {field.split('.')[-1]}={received!r}"
    more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
    return f"`{field}`: {message}{shown}{more}"


def _is_union_tag(part: object) -> bool:
    text = str(part)
    return text in {"str", "list[str]", "dict[str,str]", "one", "per_output", "per_output_list"} or text.startswith(
        ("function-", "union[", "dict[", "list["))


def _did_you_mean(root_model: type[BaseModel], loc: Sequence[Any]) -> str:
    """"; did you mean `x`?" naming the closest known field at the location of an unknown one, or ""."""
    model: type[BaseModel] | None = root_model
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        if field is None:
            return ""
        model = _model_in(field.annotation)
        if model is None:
            return ""
    return did_you_mean(loc[-1], model.model_fields)  # type: ignore[union-attr]  # a None model returned above


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
