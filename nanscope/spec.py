"""The YAML run spec: typed sections, validated once at load.

A run spec has three sections, `model`, `data` and `train`. Field names are a
contract with users' spec files: fields may be added, never renamed. Paths are
relative to the spec file. Every validation error names the file, the field and
the value received, as one line.

Example:
    spec = load_spec("configs/exploding-regression.yaml")
    spec = apply_overrides(spec, steps=300, learning_rate=1e-3)
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from nanscope.errors import SpecError, did_you_mean

CLIP_FIELDS = ("clipnorm", "global_clipnorm", "clipvalue")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Section):
    """Where the model comes from: a Python factory, or a saved file.

    Args:
        factory: str, optional. `file.py:function` or `dotted.module:function`.
        args: dict, default {}. Keyword arguments for the factory.
        path: str, optional. A `.keras` file or a TF SavedModel directory.
    """

    factory: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    path: str | None = None

    @model_validator(mode="after")
    def _one_source(self):
        if (self.factory is None) == (self.path is None):
            raise ValueError("give exactly one of `factory` or `path`")
        return self


class SyntheticSpec(_Section):
    """A seeded numpy generator, modelled on scikit-learn's make_regression / make_classification.

    Args:
        kind: "regression" | "classification".
        samples: int, default 1000.
        features: int, default 20.
        informative: int, optional. Features that carry signal (default: half, at least 1).
        noise: float, default 0.1. Standard deviation of Gaussian noise on the target.
        classes: int, default 2. Classification only.
        seed: int, default 1.
    """

    kind: Literal["regression", "classification"]
    samples: int = Field(1000, gt=0)
    features: int = Field(20, gt=0)
    informative: int | None = Field(None, gt=0)
    noise: float = Field(0.1, ge=0)
    classes: int = Field(2, ge=2)
    seed: int = 1


class FeatureSpec(_Section):
    """One feature of a TFRecord file: `{dtype: float32, shape: [20]}`."""

    dtype: Literal["float32", "float64", "int64"] = "float32"
    shape: list[int] = Field(default_factory=list)


class ValidationSpec(_Section):
    """The held-out part: the last `fraction` of the rows, as Keras' validation_split."""

    fraction: float = Field(0.0, ge=0.0, lt=1.0)


class DataSpec(_Section):
    """Where the training data comes from and how it is batched.

    Exactly one of `synthetic`, `path`, `factory`. For npz/npy the arrays are the keys
    `x` and `y`; for csv, `target` names the target column(s); for TFRecord,
    `features` maps feature names to their spec and `target` names the label feature.
    A multi-output model takes one target per output: `y` (npz, npy) or `target`
    (csv, TFRecord) as a mapping from output name to key, file, column or feature.
    """

    synthetic: SyntheticSpec | None = None
    path: str | None = None
    factory: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    x: str = "x"
    # One target array, or one per output of a multi-output model: a list in output
    # order, or a mapping from output name to array key (npz) or file (npy).
    y: str | list[str] | dict[str, str] = "y"
    # csv: the target column(s); per output of a multi-output model, a mapping from output name to column(s).
    target: str | list[str] | dict[str, str | list[str]] | None = None
    features: dict[str, FeatureSpec] | None = None
    batch_size: int = Field(32, gt=0)
    shuffle: bool = True
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    allow_nonfinite: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("synthetic", "path", "factory") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of `synthetic`, `path` or `factory`"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class LossSpec(_Section):
    """A Keras loss by name with its arguments, or `file.py:function`.

    In YAML either a plain name (`loss: mse`) or a mapping
    (`loss: {name: sparse_categorical_crossentropy, from_logits: true}`).
    """

    model_config = ConfigDict(extra="allow")
    name: str


def _loss_form(value):
    """Which form a `train.loss` value takes: one loss, one per output by name, or one per output in order."""
    if isinstance(value, (list, tuple)):
        return "per_output_list"
    if isinstance(value, dict) and "name" not in value:
        return "per_output"
    return "one"


def _named(value):
    return {"name": value} if isinstance(value, str) else value


# `train.loss`: `mse`, `{name: mse}`, `{out_a: mse, out_b: {name: ...}}` or `[mse, ...]`.
LossField = Annotated[
    Annotated[LossSpec, Tag("one")]
    | Annotated[dict[str, LossSpec], Tag("per_output")]
    | Annotated[list[LossSpec], Tag("per_output_list")],
    Discriminator(_loss_form),
]


class ScheduleSpec(_Section):
    """A learning-rate schedule: `{class_name: ExponentialDecay, config: {initial_learning_rate: 0.01, ...}}`.

    `class_name` is a Keras schedule (ExponentialDecay, CosineDecay, PiecewiseConstantDecay, ...)
    or `file.py:Class` for a user's LearningRateSchedule, built with `config` as its arguments;
    the form a report's `run.learning_rate_schedule` writes.
    """

    class_name: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)


class OptimizerSpec(_Section):
    """A Keras optimizer by name with any of its arguments, clipping included; `learning_rate` a number or a
    ScheduleSpec."""

    model_config = ConfigDict(extra="allow")
    name: str = "sgd"
    learning_rate: Annotated[float, Field(gt=0)] | ScheduleSpec | None = None
    clipnorm: float | None = Field(None, gt=0)
    global_clipnorm: float | None = Field(None, gt=0)
    clipvalue: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_clip_mode(self):
        given = [k for k in CLIP_FIELDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of clipnorm, global_clipnorm, clipvalue (got {', '.join(given)})")
        return self

    def keras_kwargs(self):
        """The optimizer's keyword arguments, unset fields left to Keras' defaults."""
        return {k: v for k, v in self.model_dump(exclude={"name"}).items() if v is not None}


class TrainSpec(_Section):
    """How to train: loss, optimizer, number of steps, seed.

    `loss` and `optimizer` may be left out when the model factory returns a compiled model.
    A multi-output model takes one loss for every output, a mapping from output name to
    loss, or a list in output order, as `model.compile`; `loss_weights` weighs them.
    """

    loss: LossField | None = None
    loss_weights: dict[str, float] | list[float] | None = None
    optimizer: OptimizerSpec | None = None
    steps: int = Field(100, gt=0)
    seed: int = 0
    jit_compile: bool = False
    expect_nonfinite: list[str] = Field(default_factory=list)
    mixed_precision: Literal["mixed_float16", "mixed_bfloat16"] | None = None
    # "mirrored": tf.distribute.MirroredStrategy over every GPU (every logical CPU without one); "multi_worker":
    # MultiWorkerMirroredStrategy over the workers TF_CONFIG names; docs/distribute.md.
    distribute: Literal["mirrored", "multi_worker"] | None = None
    # multi_worker: how long a worker waits for a missing or silent one before it stops.
    distribute_timeout_s: float = Field(60.0, gt=0)

    @field_validator("optimizer", mode="before")
    @classmethod
    def _by_name(cls, value):
        return _named(value)

    @field_validator("loss", mode="before")
    @classmethod
    def _losses_by_name(cls, value):
        form = _loss_form(value)
        entries = value if form == "per_output_list" else value.values() if form == "per_output" else [value]
        if any(one is not None and not isinstance(one, (str, dict)) for one in entries):
            raise ValueError("expected a Keras loss name, `{name: ..., <arguments>}`, `file.py:function`, "
                             "or one of those per output (a mapping from output name, or a list)")
        if form == "per_output_list":
            return [_named(v) for v in value]
        if form == "per_output":
            return {k: _named(v) for k, v in value.items()}
        return _named(value)


class RunSpec(_Section):
    """A whole run spec. `source` is the file it was read from (paths resolve against its folder)."""

    model: ModelSpec
    data: DataSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    source: str | None = Field(None, exclude=True)

    @property
    def base_dir(self):
        """The folder that relative paths in the spec are resolved against."""
        return Path(self.source).parent if self.source else Path.cwd()

    def resolve(self, path):
        """`path` resolved against the spec's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.base_dir / p


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


def describe_validation_error(exc, root_model):
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


def _is_union_tag(part):
    text = str(part)
    return text in {"str", "list[str]", "dict[str,str]", "one", "per_output", "per_output_list"} or text.startswith(
        ("function-", "union[", "dict[", "list["))


def _did_you_mean(root_model, loc):
    """"; did you mean `x`?" naming the closest known field at the location of an unknown one, or ""."""
    model = root_model
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        if field is None:
            return ""
        model = _model_in(field.annotation)
        if model is None:
            return ""
    return did_you_mean(loc[-1], model.model_fields)


def _model_in(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _yaml_problem(exc):
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
