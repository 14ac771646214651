"""Which phase, layer and variable a non-finite step is attributed to, when several things in it are bad.

A step's phase is the earliest one that saw a non-finite value (StepRecord.phase): data,
forward, loss, backward, update. Every pair (phase, a later phase) is tested with both bad,
and each phase alone. Within a phase: the forward pass names the first layer called (call
order, not record order) whose output is bad and not expected to be; the backward pass the
last bad variable (gradients flow from the loss backwards: the last is nearest the loss); the
update the first variable whose weights went bad.
"""

import itertools
import math

import pytest

from nanscope.run.attribution import StepNames, attribute_from_record
from nanscope.engine.records import LayerStats, OutputStats, StepRecord, VariableStats

PHASES = ("data", "forward", "loss", "backward", "update")
LAYERS = [("embed", "Embedding"), ("hidden", "Dense"), ("head", "Dense")]
CALL_ORDER = ["embed", "hidden", "head"]
VARIABLES = ["embed/embeddings", "hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]


def record(bad_phases=(), bad_layers=(), bad_grads=(), bad_weights=(), expected=(), outputs=None, **fields):
    """A step with non-finite values in `bad_phases` (and in the named layers' outputs and variables)."""
    bad_phases = set(bad_phases)
    if "forward" in bad_phases and not bad_layers:
        bad_layers = ("hidden",)
    if "backward" in bad_phases and not bad_grads:
        bad_grads = ("hidden/kernel",)
    if "update" in bad_phases and not bad_weights:
        bad_weights = ("head/kernel",)
    layers = [LayerStats(1.0, 0.5, 3 if name in bad_layers else 0, 0.0, 0.0) for name, _ in LAYERS]
    variables = [VariableStats(math.nan if name in bad_grads else 1.0, 2 if name in bad_grads else 0, 1.0, 1e-3,
                               4 if name in bad_weights else 0) for name in VARIABLES]
    values = {
        "step": 7, "batch_rows": 8, "loss": math.nan if "loss" in bad_phases else 1.0, "data_loss": 1.0,
        "grad_global_norm": math.nan if bad_grads else 1.0, "applied_grad_global_norm": 1.0,
        "x_nonfinite": 2 if "data" in bad_phases else 0, "y_nonfinite": 0,
        "output_nonfinite": 1 if bad_layers else 0, "loss_nonfinite": "loss" in bad_phases,
        "grad_nonfinite": 2 * len(bad_grads), "weights_nonfinite": 4 * len(bad_weights),
        "layers": layers, "variables": variables, "expected_nonfinite": [i for i, (n, _) in enumerate(LAYERS)
                                                                         if n in expected],
        "outputs": outputs or [], **fields,
    }
    return StepRecord(**values)


NAMES = StepNames(layers=LAYERS, call_order=CALL_ORDER, variables=VARIABLES, outputs=["price", "kind"])
PAIRS = [pytest.param(a, b, id=f"{a}-and-{b}") for a, b in itertools.combinations(PHASES, 2)]


@pytest.mark.parametrize("phase", PHASES)
def test_each_phase_alone(phase):
    one = record([phase])
    assert one.phase == phase and not one.finite
    assert attribute_from_record(one, NAMES).phase == phase


@pytest.mark.parametrize("earlier, later", PAIRS)
def test_the_earlier_phase_wins_over_every_later_one(earlier, later):
    both = record([earlier, later])
    assert both.phase == earlier
    assert attribute_from_record(both, NAMES).phase == earlier


def test_all_phases_at_once_is_the_data_phase_and_none_is_finite():
    assert record(PHASES).phase == "data"
    assert record().phase is None and record().finite


def test_y_alone_is_the_data_phase():
    assert record(y_nonfinite=1).phase == "data"


@pytest.mark.parametrize("bad, named", [
    (("head",), ("head", "Dense")),
    (("hidden", "head"), ("hidden", "Dense")),
    (("embed", "hidden", "head"), ("embed", "Embedding")),
])
def test_the_forward_pass_names_the_first_bad_layer_called(bad, named):
    first = attribute_from_record(record(["forward"], bad_layers=bad), NAMES)
    assert (first.step, first.phase, first.layer, first.layer_class, first.variable) == (7, "forward", *named, None)


def test_call_order_not_record_order_decides_the_forward_layer():
    names = StepNames(layers=LAYERS, call_order=["head", "hidden", "embed"], variables=VARIABLES)
    first = attribute_from_record(record(["forward"], bad_layers=("embed", "head")), names)
    assert (first.layer, first.layer_class) == ("head", "Dense")


def test_an_expected_bad_layer_is_skipped_and_alone_is_no_forward_phase():
    both = record(["forward"], bad_layers=("embed", "head"), expected=("embed",))
    assert attribute_from_record(both, NAMES).layer == "head"
    # The expected layer alone, with the model output bad only through it, leaves the step finite.
    assert record(bad_layers=("embed",), expected=("embed",)).phase is None


@pytest.mark.parametrize("bad, variable", [
    (("embed/embeddings",), "embed/embeddings"),
    (("hidden/kernel", "hidden/bias"), "hidden/bias"),
    (("embed/embeddings", "hidden/kernel", "head/kernel"), "head/kernel"),
    (("hidden/bias", "head/bias"), "head/bias"),
])
def test_the_backward_pass_names_the_last_bad_variable(bad, variable):
    first = attribute_from_record(record(["backward"], bad_grads=bad), NAMES)
    assert (first.phase, first.variable, first.layer) == ("backward", variable, variable.split("/")[0])
    assert first.detail == [f"{len(bad)} of 5 variables affected"]


@pytest.mark.parametrize("bad, variable", [
    (("head/bias",), "head/bias"),
    (("hidden/kernel", "hidden/bias"), "hidden/kernel"),
    (("embed/embeddings", "hidden/kernel", "head/kernel"), "embed/embeddings"),
])
def test_the_update_names_the_first_bad_variable(bad, variable):
    first = attribute_from_record(record(["update"], bad_weights=bad), NAMES)
    assert (first.phase, first.variable, first.layer) == ("update", variable, variable.split("/")[0])
    assert first.detail == [f"{len(bad)} of 5 variables affected"]


def test_a_variable_without_a_layer_path_names_no_layer():
    names = StepNames(layers=LAYERS, call_order=CALL_ORDER, variables=["a", "b", "c", "d", "e"])
    bad = record(["backward"], bad_grads=("hidden/kernel",))  # the second variable
    assert (attribute_from_record(bad, names).variable, attribute_from_record(bad, names).layer) == ("b", None)


@pytest.mark.parametrize("before", [2.0, 1.0, 0.125])
def test_a_skipped_update_is_absorbed_at_any_scale_until_the_scale_collapsed(before):
    # Keras 3's scale has no floor: a skip below 1 is still loss scaling at work (engine/loss_scale.py judges collapse).
    skipped = record(bad_grads=("head/kernel",), update_skipped=True, loss_scale=before / 2, loss_scale_before=before)
    assert skipped.phase is None
    collapsed = record(bad_grads=("head/kernel",), update_skipped=True, loss_scale=before / 2,
                       loss_scale_before=before, scale_collapsed=True)
    assert collapsed.phase == "backward"
    first = attribute_from_record(collapsed, NAMES)
    assert first.detail[-1].startswith(f"the LossScaleOptimizer skipped this update with its scale at {before:g}, ")
    # Not skipped, bad gradients are the backward phase whatever the scale.
    assert record(bad_grads=("head/kernel",), loss_scale=before).phase == "backward"


@pytest.mark.parametrize("phase, outputs, named", [
    ("data", [OutputStats(1.0, 0, 0), OutputStats(1.0, 3, 0)], "kind"),
    ("forward", [OutputStats(1.0, 0, 2), OutputStats(1.0, 0, 1)], "price"),
    ("loss", [OutputStats(1.0, 0, 0), OutputStats(math.inf, 0, 0)], "kind"),
    ("backward", [OutputStats(math.inf, 1, 1), OutputStats(1.0, 0, 0)], None),  # outputs name no backward pass
])
def test_the_output_named_is_the_first_that_shows_the_phase(phase, outputs, named):
    assert attribute_from_record(record([phase], outputs=outputs), NAMES).output == named


def test_the_replica_and_worker_named_are_the_first_that_saw_a_bad_value():
    first = attribute_from_record(record(["loss"], replica_nonfinite=[0, 3, 1, 0], worker_nonfinite=[0, 4]), NAMES)
    assert (first.replica, first.worker) == (1, 1)
    alone = attribute_from_record(record(["loss"]), NAMES)
    assert (alone.replica, alone.worker) == (None, None)  # one device: no replica to name
