"""The NanScope callback on keras-io's generative models: `train_step` overridden, `call` never defined.

The VAE's encoder and decoder are built, the model itself never is; the GAN compiles
with its own two optimizers. nanscope must record them as they train, and change nothing.
"""

import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from rich.console import Console

from nanscope.keras import NanScope

sys.path.insert(0, str(Path(__file__).parent / "specs"))
import generative


def fit(model, tmp_path=None):
    callbacks = [NanScope(report=tmp_path / "report.json", console=Console(quiet=True))] if tmp_path else []
    return model.fit(generative.images(), epochs=2, batch_size=16, verbose=0, callbacks=callbacks).history


def same_history(history, without):
    """The same metrics, each the same to float32 reduction noise: under load the VAE's second loss differed in its
    last bits (43.863842 with nanscope, 43.863846 without), as two runs without nanscope do in test_rng_state when
    TensorFlow's threads sum in another order."""
    return history.keys() == without.keys() and all(
        history[name] == pytest.approx(without[name], rel=1e-6) for name in without)


def test_a_vae_without_call_is_recorded_and_trains_as_without(tmp_path, caplog):
    without = fit(generative.vae())
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        assert same_history(fit(generative.vae(), tmp_path), without)
    assert not [r for r in caplog.records if r.name == "nanscope"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps_run"] == 8 and report["first_nonfinite"] is None
    # The step logs its loss tracker's running mean: the epoch's last step holds the epoch's loss.
    losses = [step["loss"] for step in report["steps"]]
    assert losses[3] == pytest.approx(without["loss"][0], rel=1e-6)
    assert losses[7] == pytest.approx(without["loss"][1], rel=1e-6)
    assert all(step["grad_global_norm"] > 0 for step in report["steps"])
    assert len(report["layers"]) == 12  # the two sub-models and their 10 layers
    assert {layer["name"] for layer in report["layers"]} >= {"encoder", "decoder", "z_mean", "z_log_var"}
    assert len(report["variables"]) == 14  # conv, 3 dense in the encoder; dense, 2 transposed convs: kernel + bias
    assert report["run"]["optimizer"] == "Adam"
    # No compiled loss: the header names where the loss comes from ("compute_loss" named a method it never ran).
    assert report["run"]["loss"] == "the model's own train_step (no compiled loss)"


def test_a_gan_with_its_own_optimizers_is_recorded_and_trains_as_without(tmp_path):
    without = fit(generative.gan())
    assert same_history(fit(generative.gan(), tmp_path), without)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps_run"] == 8 and report["first_nonfinite"] is None
    # The gradients reach d_optimizer and g_optimizer, not compile()'s default RMSprop that the step never uses.
    assert report["run"]["optimizer"] == "Adam"
    assert report["run"]["optimizer_config"]["learning_rate"] == pytest.approx(3e-4)
    assert len(report["variables"]) == 10
    assert all(np.isfinite(step["grad_global_norm"]) and step["grad_global_norm"] > 0 for step in report["steps"])
    assert all(v["max_grad_norm"] > 0 for v in report["variables"])
    # Its step logs d_loss and g_loss, no "loss": the report says the loss is unknown instead of inventing one.
    assert all(step["loss"] is None for step in report["steps"])
    assert report["run"]["loss"] == "the model's own train_step (no compiled loss)"
