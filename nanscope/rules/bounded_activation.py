"""`bounded-activation`: a layer's outputs growing toward its dtype's overflow bound, or past it."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.engine.limits import activation_limit
from nanscope.tf_types import KerasModel
from nanscope.internals import flatten_layers
from nanscope.rules.facts import Facts, LayerFacts
from nanscope.tf_types import Layer
from nanscope.rules.fixes import Bundle, Change, Session, StepFix
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule
from nanscope.rules.trends import geometric_growth
from nanscope.rules.weight_constraint import WEIGHT_GROWTH_LIMIT
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.model.models import LoadedModel

BOUNDED_ACTIVATION = Rule(
    "bounded-activation",
    "Bound the activations",
    "Layer outputs (typically ReLU) growing toward the dtype's overflow bound, or overflowing.",
    "keras.layers.Dense(units, activation='relu6')  # or add keras.layers.LayerNormalization() after it",
)
RULES = (BOUNDED_ACTIVATION,)
FIXTURES = Fixtures(fires=("irnn-relu-state-growth",), quiet=("tabular-regression-adam", "irnn-relu6-layer-norm"))

# Layer outputs growing by more than 50% a step over at least 5 steps and by 1e4
# overall: healthy outputs settle within a small factor of their start.
OUTPUT_GROWTH_RATE = 1.5
OUTPUT_GROWTH_MIN_STEPS = 5
OUTPUT_GROWTH_MIN_TOTAL = 1e4
# Outputs that grow while the weights' norm grows past weight-constraint's limit grow because the weights do: a
# bounded activation cannot stop that (on the bundled exploding regression `--verify` finds relu6 finite but not
# learning: a validation loss of 2.95e24 against the constant prediction's 32443), so the finding is then info.
WEIGHTS_GROWING = WEIGHT_GROWTH_LIMIT
# Keras' recurrent layers, whose relu state grows with the recurrent kernel's gain over the sequence (an IRNN).
RECURRENT = {"SimpleRNN", "GRU", "LSTM", "SimpleRNNCell", "GRUCell", "LSTMCell"}


def detect(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for the first layer whose healthy outputs passed their dtype's bound, or grew
    geometrically through a relu-like activation."""
    weights = weight_growth(facts)
    severity = "info" if weights is not None else "error" if facts.failed else "warning"
    for layer in facts.layers:
        limit = activation_limit(layer.dtype)
        # The largest value is exact over every healthy step, and so is the trend (see history.TREND_WINDOW).
        peak = layer.max_abs_healthy
        if peak is None:
            continue
        trend = geometric_growth(layer.trend_steps, layer.trend_values, OUTPUT_GROWTH_RATE, OUTPUT_GROWTH_MIN_STEPS,
                                 OUTPUT_GROWTH_MIN_TOTAL)
        if peak <= limit and (trend is None or not layer.relu_like):
            continue
        evidence = [f"layer {layer.name} ({layer.cls}, {layer.dtype}) output max |x| reached {peak:.3g} "
                    f"(warning bound {limit:.3g} for {layer.dtype})"]
        if trend is not None:
            evidence.append(f"it grew {trend[0]:.3g}x per step from step {trend[1]}")
        if weights is not None:
            evidence.append(f"the weights' norm grew {weights:.3g}x over the same steps: the outputs grow because the "
                            "weights do, and bounding the activation does not stop that")
        data = {"layer": layer.name, "max_abs": peak, "limit": limit, "relu": layer.relu_like}
        return [(0.65, BOUNDED_ACTIVATION.recommend(severity, evidence, bound_for(layer), data))]
    return []


def weight_growth(facts: Facts) -> float | None:
    """The weights' norm at the last healthy step over its start (the initial norm where known), when that is
    WEIGHTS_GROWING or more; else None."""
    norms = facts.healthy.weight_norm
    norms = norms[np.isfinite(norms)]
    start = facts.initial_weight_norm if facts.initial_weight_norm is not None else norms[0] if len(norms) else None
    if not start or not len(norms):
        return None
    growth = float(norms[-1]) / start
    return growth if growth >= WEIGHTS_GROWING else None


def bound_for(layer: LayerFacts) -> str:
    """The fix for `layer`'s growing outputs: relu6 where its activation is relu-like (on a recurrent layer, in its
    own class); otherwise a float32 layer (a float16 one) or a LayerNormalization after it, since relu6 cannot bound
    an exp or a linear output."""
    if layer.relu_like and layer.cls in RECURRENT:
        # A LayerNormalization after a recurrent layer does not bound the state it carries from step to step.
        return (f"keras.layers.{layer.cls}(units, activation='relu6')  # layer {layer.name}; or tanh, Keras' default "
                "for a recurrent layer")
    if layer.relu_like:
        return BOUNDED_ACTIVATION.fix
    if layer.dtype in ("float16", "bfloat16"):
        return f"keras.layers.{layer.cls}(..., dtype='float32')  # layer {layer.name}: compute it in float32"
    return f"keras.layers.LayerNormalization()  # after layer {layer.name}: its outputs are not bounded"


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """The run again with every relu made relu6 (a model nanscope can clone), where the growing layer is relu-like."""
    if not rec.data.get("relu", True):
        return []
    del run  # Unused
    model = relu6_model(session.model)
    return [Change("relu->relu6", {"activation": "relu6"}, model=model)] if model is not None else []


def relu6_model(loaded: "LoadedModel") -> "LoadedModel | None":
    """A clone of a Sequential/functional Keras model with every relu made relu6, weights copied; None if not
    possible."""
    _tf, keras = tensorflow()
    model = loaded.keras_model
    if model is None or not _has_relu(model):
        return None

    def clone_layer(layer: Layer) -> Layer:
        config = layer.get_config()
        if config.get("activation") == "relu":
            config["activation"] = "relu6"
        if type(layer).__name__ == "ReLU" and config.get("max_value") is None:
            config["max_value"] = 6.0
        return type(layer).from_config(config)

    try:
        clone = keras.models.clone_model(model, clone_function=clone_layer)
        clone.set_weights(model.get_weights())
    except Exception:  # subclassed models cannot be cloned: the fix is then not automatically applicable
        return None
    from nanscope.model.models import from_keras

    return from_keras(clone, f"{loaded.description} with relu6")


def _has_relu(model: KerasModel) -> bool:
    for layer in flatten_layers(model):
        config = layer.get_config() if hasattr(layer, "get_config") else {}
        if config.get("activation") == "relu" or type(layer).__name__ == "ReLU":
            return True
    return False


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved step with every relu layer's activation made relu6 (put back after), where the growing layer is
    relu-like."""
    if not rec.data.get("relu", True):
        return []
    del run  # Unused
    _, keras = tensorflow()
    relu = keras.activations.relu
    layers = [layer for layer in flatten_layers(bundle.model) if getattr(layer, "activation", None) is relu
              or (type(layer).__name__ == "ReLU" and getattr(layer, "max_value", 0) is None)]
    if not layers:
        return []

    def change(model: KerasModel) -> Callable[[], None]:
        del model  # Unused
        saved = [(layer, "activation", layer.activation) if hasattr(layer, "activation") and
                 layer.activation is relu else (layer, "max_value", layer.max_value) for layer in layers]
        for layer, name, _ in saved:
            setattr(layer, name, keras.activations.relu6 if name == "activation" else 6.0)

        def undo() -> None:
            for layer, name, old in saved:
                setattr(layer, name, old)

        return undo

    return [StepFix("relu->relu6", {"activation": "relu6"}, acts_on="step", change=change)]
