"""RNN layers in the instrumented step: the layer's own output is probed, its looped cell is not."""

import numpy as np
import pytest

from nanscope.engine.model_view import probed_layers
from nanscope.engine.step import InstrumentedStep
from nanscope.model.models import from_keras
from nanscope.run.losses import Loss
from nanscope.runtime import tensorflow

tf, keras = tensorflow()


def test_the_cells_an_rnn_loops_over_are_not_probed_and_an_unrolled_rnn_keeps_its_cell():
    model = keras.Sequential([
        keras.Input((5, 3)), keras.layers.SimpleRNN(4, return_sequences=True, name="simple"),
        keras.layers.Bidirectional(keras.layers.LSTM(2, return_sequences=True), name="both"),
        keras.layers.RNN(keras.layers.StackedRNNCells([keras.layers.GRUCell(3), keras.layers.GRUCell(3)]),
                         name="stacked"),
        keras.layers.Dense(1, name="head")])
    # By class: Keras numbers the names of layers it names itself (a Bidirectional's copies) per process.
    assert [type(layer).__name__ for layer in probed_layers(model)] == [
        "SimpleRNN", "Bidirectional", "LSTM", "LSTM", "RNN", "Dense"]
    unrolled = keras.Sequential([keras.Input((5, 3)), keras.layers.SimpleRNN(4, unroll=True, name="simple"),
                                 keras.layers.Dense(1, name="head")])
    assert [type(layer).__name__ for layer in probed_layers(unrolled)] == ["SimpleRNN", "SimpleRNNCell", "Dense"]


@pytest.mark.parametrize("unroll", [False, True])
def test_an_irnn_s_layer_row_is_its_whole_output_and_an_unrolled_cell_s_every_step(unroll):
    """An IRNN (relu, identity recurrent kernel) on a ramp: the state grows every time step, so the first time
    step's values (what a looped cell's probe used to report) are far below the layer's."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((12, 1)),
        keras.layers.SimpleRNN(3, activation="relu", recurrent_initializer="identity", kernel_initializer="ones",
                               return_sequences=True, unroll=unroll, name="irnn"),
        keras.layers.Dense(1, name="head")])
    x = np.linspace(1.0, 2.0, 4 * 12, dtype=np.float32).reshape(4, 12, 1)
    y = np.zeros((4, 12, 1), np.float32)
    step = InstrumentedStep(from_keras(model, "m"), Loss(keras.losses.MeanSquaredError(), "mse"),
                            keras.optimizers.SGD(0.0), x, y)
    states = keras.Model(model.inputs, model.get_layer("irnn").output)(x).numpy()
    record = step.run(0, x, y)
    names = [type(layer).__name__ for layer in step.layers]
    rnn = record.layers[names.index("SimpleRNN")]
    assert rnn.max_abs == pytest.approx(np.abs(states).max(), rel=1e-6)
    assert rnn.mean_abs == pytest.approx(np.abs(states).mean(), rel=1e-6)
    assert np.abs(states).max() > 10 * np.abs(states[:, 0]).max()
    if unroll:  # the cell returns (output, [state]) every time step: twice the layer's values, each time step's
        cell = record.layers[names.index("SimpleRNNCell")]
        assert cell.max_abs == pytest.approx(np.abs(states).max(), rel=1e-6)
    else:
        assert "SimpleRNNCell" not in names
