"""The guard's own failures: one warning line and a note; the user's run goes on as it would without nanscope.

The failures are forced in nanscope's own code (a host copy of the state that raises, a
re-run that raises), never in TensorFlow's.
"""

import logging

import numpy as np

from nanscope.guard.state import GuestState
from nanscope.keras import NanScope
from nanscope.keras.probe import StepProbe
from test_guard import BATCH, mlp, regression

WARNING = "nanscope: the guard stopped at step"


def fit(x, y, scope=None):
    model = mlp()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                        callbacks=[scope] if scope is not None else [])
    return model, history.history["loss"]


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "nanscope" and r.levelno >= logging.WARNING]


def test_a_state_copy_that_fails_leaves_the_fit_as_it_is_without_nanscope(monkeypatch, caplog):
    x, y = regression()
    plain, plain_losses = fit(x, y)

    def no_host_memory(self):
        raise MemoryError("host copy of the state failed")

    monkeypatch.setattr(GuestState, "current", no_host_memory)
    scope = NanScope(verbose=0, on_nonfinite="rollback", snapshot_every=2)
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        model, losses = fit(x, y, scope)

    assert warnings(caplog) == [f"{WARNING} 0 (MemoryError: host copy of the state failed); training goes on "
                                "without it"]
    assert ("guard: its own code failed at step 0 (MemoryError: host copy of the state failed); it stood down "
            "there and training went on without it") in scope.report.notes
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for mine, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert scope.report.steps_run == 16 and scope.report.interventions == []


def test_a_rerun_that_raises_at_the_first_nan_is_one_warning_and_the_fit_goes_on(monkeypatch, caplog):
    x, y = regression()
    x[3 * BATCH + 1, 0] = np.nan
    plain, plain_losses = fit(x, y)

    def broken(self, data, step=-1):
        raise RuntimeError("re-run failed")

    monkeypatch.setattr(StepProbe, "rerun", broken)
    scope = NanScope(verbose=0, on_nonfinite="skip")
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        model, losses = fit(x, y, scope)

    assert warnings(caplog) == [f"{WARNING} 3 (RuntimeError: re-run failed); training goes on without it"]
    report = scope.report
    assert report.first_nonfinite.step == 3 and report.first_nonfinite.reproducible is None
    assert any(note.startswith("guard: its own code failed at step 3 (RuntimeError") for note in report.notes)
    # Standing down, the guard skips nothing: the run is the one without nanscope, NaN weights and all.
    assert report.interventions == [] and report.steps_run == 16
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for mine, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert not np.isfinite(model.get_weights()[0]).all()
