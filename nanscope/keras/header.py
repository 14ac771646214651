"""The report's run header for a guest run: `model.fit` with NanScope, or a step under `instrument`."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from nanscope.engine.model_view import is_loss_scale_optimizer
from nanscope.keras.workers import WorkerRole, describe_strategy
from nanscope.model.optimizers import optimizer_settings
from nanscope.report.header import run_header
from nanscope.runtime import tensorflow
from nanscope.store.history import StepHistory
from nanscope.tf_types import KerasModel, Layer, Optimizer, Strategy


class _Probe(Protocol):
    """What a fit's header reads of its StepProbe (keras/probe.py)."""

    @property
    def optimizers(self) -> list[Optimizer]: ...

    @property
    def layers(self) -> list[Layer]: ...

    @property
    def strategy(self) -> Strategy: ...

    @property
    def replicas(self) -> int: ...

    @property
    def per_execution(self) -> int: ...


class _RateView(Protocol):
    """The optimizer's LearningRateView (model/learning_rate.py), as far as the header reads it."""

    def header_fields(self) -> dict[str, Any]: ...

# What a guest run (fit, a custom loop) cannot know when it starts; the callback fills in the
# rows and the batch size it saw (rows_seen) at the end.
UNKNOWN_TO_GUESTS = dict.fromkeys(("train_rows", "validation_rows", "batch_size", "shuffle", "seed"))


def fit_header(model: KerasModel, params: Mapping[str, Any], probe: _Probe, role: WorkerRole | None = None,
               learning_rate: _RateView | None = None) -> dict[str, Any]:
    """The run header of a `fit` run, with the fields trace-steps' header has where they are known.

    Call once the model is built, before its first step (`learning_rate`: the optimizer's LearningRateView,
    which adds the schedule under one).
    """
    optimizers = probe.optimizers
    optimizer_name, optimizer_config = optimizer_settings(optimizers[0] if optimizers else None)
    epochs, steps = params.get("epochs"), params.get("steps")
    distribute = ({"distribute": describe_strategy(probe.strategy, probe.replicas, role or WorkerRole())}
                  if probe.replicas > 1 else {})
    return run_header(
        **UNKNOWN_TO_GUESTS,
        spec="model.fit (nanscope.keras.NanScope)",
        model=f"{model.name} ({type(model).__name__}, {len(probe.layers)} layers)",
        model_kind="keras-fit",
        parameters=parameter_count([model]),
        data="as given to fit",
        loss=model_loss_name(model),
        optimizer=optimizer_name,
        optimizer_config=optimizer_config,
        **(learning_rate.header_fields() if learning_rate is not None else {}),
        steps_requested=epochs * steps if epochs and steps else None,
        jit_compile=bool(model.jit_compile),
        steps_per_execution=probe.per_execution,
        **precision(probe.layers, optimizers),
        **distribute,
    )


def rows_seen(history: StepHistory, steps_per_epoch: int | None) -> dict[str, int]:
    """The header's `batch_size` (the first batch's rows) and `train_rows` (the rows of the first whole epoch),
    from the batches the callback saw (a StepHistory); empty where it saw too little to say."""
    seen: dict[str, int] = {}
    rows = history.column("batch_rows")
    if len(rows):
        seen["batch_size"] = int(rows[0])
    if steps_per_epoch and len(rows) >= steps_per_epoch:
        seen["train_rows"] = int(rows[:steps_per_epoch].sum())
    return seen


def parameter_count(models: Iterable[KerasModel]) -> int:
    """Weights of built models, counted from their variables (an unbuilt model has none yet)."""
    return int(sum(v.shape.num_elements() or 0 for model in models for v in model.weights))


def precision(layers: Sequence[Layer], optimizers: Iterable[Optimizer | None]) -> dict[str, Any]:
    """`mixed_precision`, `loss_scaling` and `layer_dtypes` of the header, as trace-steps writes them."""
    dtypes = {layer.name: str(getattr(layer, "compute_dtype", "float32")) for layer in layers}
    names = (getattr(getattr(layer, "dtype_policy", None), "name", None) for layer in layers)
    policies = {name for name in names if name is not None}
    mixed = next((p for p in sorted(policies) if p.startswith("mixed_")), None)
    return {"mixed_precision": mixed, "loss_scaling": any(is_loss_scale_optimizer(o) for o in optimizers if o),
            "layer_dtypes": dtypes}


def fit_outputs(model: KerasModel, output_names: Sequence[str]) -> list[dict[str, Any]]:
    """The run header's `outputs` of a fit run: per output of a multi-output model its name, loss and weight."""
    from nanscope.keras.outputs import output_loss_specs

    specs = output_loss_specs(model)
    if len(specs) != len(output_names):
        return [{"name": name, "loss": None, "weight": None} for name in output_names]
    by_name = {str(name): (loss, weight) for name, loss, weight in specs}
    if set(by_name) == {str(name) for name in output_names}:  # compile's dict order need not be the outputs' order
        return [{"name": name, "loss": by_name[str(name)][0], "weight": by_name[str(name)][1]} for name in output_names]
    return [{"name": name, "loss": loss, "weight": weight} for name, (_, loss, weight) in zip(output_names, specs)]


def compiled_loss_name(model: KerasModel) -> str | None:
    """The name of `model`'s compiled loss ("mse"), None without one."""
    loss = getattr(model, "loss", None)
    return None if loss is None else loss_name(loss)


def model_loss_name(model: KerasModel) -> str:
    """The loss of `model` as the report names it: its compiled loss, else where its own step computes one
    (a `compute_loss` or a `train_step` the model overrides); "none compiled" for neither."""
    compiled = compiled_loss_name(model)
    if compiled is not None:
        return compiled
    _, keras = tensorflow()
    own = [name for name in ("compute_loss", "train_step")
           if getattr(type(model), name, None) is not getattr(keras.Model, name, None)]
    return f"the model's own {own[0]} (no compiled loss)" if own else "none compiled"


def loss_name(loss: Any) -> str:
    """A compiled loss as the report names it ("mse", "a: mse, b: mae"; "none compiled" for None)."""
    if loss is None:
        return "none compiled"
    if isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return ", ".join(f"{name}: {loss_name(one)}" for name, one in loss.items())
    if isinstance(loss, (list, tuple)):
        return ", ".join(loss_name(one) for one in loss)
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
