"""What a compiled Keras model trains with: the optimizers its step uses, the names of its outputs.

Read once when the `NanScope` callback starts (`StepProbe`, `FitRun`), from the model's public
attributes and Keras' compiled loss.
"""

from nanscope.internals import compile_loss
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Optimizer

_, keras = tensorflow()


def held_optimizers(model: KerasModel) -> list[Optimizer]:
    """Optimizers held as the model's own attributes (a GAN's `d_optimizer` and `g_optimizer`), in order."""
    held: list[Optimizer] = []
    for value in vars(model).values():
        if isinstance(value, keras.optimizers.Optimizer) and all(value is not o for o in held):
            held.append(value)
    return held


def training_optimizers(model: KerasModel) -> list[Optimizer]:
    """The optimizers the model's step trains with: `model.optimizer`, and those it holds as attributes.

    A model that compiles with its own optimizers (keras-io's GAN: `super().compile()`, then
    `d_optimizer` and `g_optimizer`) leaves `model.optimizer` as compile's default, which
    its step never uses and Keras never builds: it is left out then.
    """
    held = [o for o in held_optimizers(model) if o is not model.optimizer]
    own = model.optimizer
    if own is None or (held and not own.built):
        return held
    return [own, *held]


def multi_output_names(model: KerasModel) -> list[str]:
    """Names of a compiled multi-output model's outputs, in Keras' flattened order; [] for one output.

    Known before the first step only for models with symbolic outputs (functional,
    Sequential with an Input); a subclassed model's outputs are not split.
    """
    try:
        count = len(model.outputs or [])
    except (AttributeError, ValueError):
        return []
    if count < 2 or compile_loss(model) is None:
        return []
    names = list(getattr(model, "output_names", None) or [])
    return names if len(names) == count else [f"output_{i}" for i in range(count)]
