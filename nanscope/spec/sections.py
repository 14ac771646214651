"""The YAML run spec: typed sections, validated once at load.

A run spec has three sections, `model`, `data` and `train`. Field names are a
contract with users' spec files: fields may be added, never renamed. Paths are
relative to the spec file. Every validation error names the file, the field and
the value received, as one line.

Reading a spec file into these sections, and the command-line overrides, are `nanscope.spec.load`.
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator


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
    def _one_source(self) -> "ModelSpec":
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
    def _one_source(self) -> "DataSpec":
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


def _loss_form(value: object) -> str:
    """Which form a `train.loss` value takes: one loss, one per output by name, or one per output in order."""
    if isinstance(value, (list, tuple)):
        return "per_output_list"
    if isinstance(value, dict) and "name" not in value:
        return "per_output"
    return "one"


def _named(value: Any) -> Any:
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
    def _one_clip_mode(self) -> "OptimizerSpec":
        given = [k for k in CLIP_FIELDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of clipnorm, global_clipnorm, clipvalue (got {', '.join(given)})")
        return self

    def keras_kwargs(self) -> dict[str, Any]:
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
    def _by_name(cls, value: Any) -> Any:
        return _named(value)

    @field_validator("loss", mode="before")
    @classmethod
    def _losses_by_name(cls, value: Any) -> Any:
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
    def base_dir(self) -> Path:
        """The folder that relative paths in the spec are resolved against."""
        return Path(self.source).parent if self.source else Path.cwd()

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """`path` resolved against the spec's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.base_dir / p
