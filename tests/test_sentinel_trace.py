"""`trace-steps --mode sentinel`: the same training as full mode, the full rows sampled, the first NaN named alike."""

import json
import subprocess
import sys

import numpy as np

from nanscope.guard import GuardOptions

from dense_runs import BATCH, trace_dense
from data_factories import arrays


def trace(tmp_path, x, y, steps, mode, on_nonfinite="continue", **guard):
    return trace_dense(tmp_path, x, y, steps, trace_path=tmp_path / f"{mode}.jsonl", keep_going=True,
                       guard=GuardOptions(on_nonfinite=on_nonfinite, mode=mode, **guard))


def test_sentinel_trains_as_full_mode_and_samples_the_full_rows(tmp_path):
    x, y = arrays(rows=64)
    full = trace(tmp_path, x, y, 12, "full")
    sentinel = trace(tmp_path, x, y, 12, "sentinel", sample_every=5)
    assert sentinel.steps_run == full.steps_run == 12
    # Each loss is taken before the step's update: the same losses mean the same weights and Adam state.
    np.testing.assert_allclose([r.loss for r in sentinel.records], [r.loss for r in full.records], rtol=1e-6)
    np.testing.assert_allclose([r.grad_global_norm for r in sentinel.records],
                               [r.grad_global_norm for r in full.records], rtol=1e-5)
    assert [r.step for r in sentinel.records if r.layers] == [0, 5, 10]
    # The light steps measure |w| and |dw|/|w| over all weights too: the rules read them on every step.
    for column in ("weight_norm", "update_ratio"):
        np.testing.assert_allclose(sentinel.history.column(column), full.history.column(column), rtol=1e-5)
    assert sentinel.history.column("update_ratio").min() > 0
    assert [r.step for r in sentinel.records if r.variables] == [0, 5, 10]
    assert sentinel.first_nonfinite is None and sentinel.interventions == []
    assert ("mode=sentinel: full statistics on every 5th step and the 16 after an event; 9 step(s) recorded the "
            "scalars only (layer and variable tables are over the full steps)") in sentinel.notes


def test_sentinel_skips_a_poisoned_light_step_as_full_mode_does(tmp_path):
    x, y = arrays(rows=64)
    x[3 * BATCH + 2, 0] = np.nan  # batch 3: steps 3 and 7
    full = trace(tmp_path, x, y, 8, "full", "skip")
    sentinel = trace(tmp_path, x, y, 8, "sentinel", "skip", sample_every=100)
    first = sentinel.first_nonfinite
    assert (first.step, first.phase, first.detail) == (3, "data", full.first_nonfinite.detail)
    assert sentinel.interventions == full.interventions
    assert [i["step"] for i in sentinel.interventions] == [3, 7]
    np.testing.assert_allclose([r.loss for r in sentinel.records if r.phase is None],
                               [r.loss for r in full.records if r.phase is None], rtol=1e-6)
    # Steps 1-2 ran light; step 3 was re-run in full, and the 16 steps after an event run in full too.
    assert [r.step for r in sentinel.records if r.layers] == [0, 3, 4, 5, 6, 7]


def cli(tmp_path, name, *options):
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps", "configs/exploding-regression.yaml",
                           "--steps", "20", "--trace", str(tmp_path / f"{name}.jsonl"), "--json", str(out),
                           *options], capture_output=True, text=True)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_cli_sentinel_names_the_first_nan_as_full_mode_does(tmp_path):
    (full_run, full), (sentinel_run, sentinel) = cli(tmp_path, "full"), cli(tmp_path, "sentinel", "--mode", "sentinel")
    assert full_run.returncode == sentinel_run.returncode == 1, sentinel_run.stderr
    keys = ("step", "phase", "layer", "op", "source", "inputs")
    f, s = full["first_nonfinite"], sentinel["first_nonfinite"]
    assert {k: s.get(k) for k in keys} == {k: f.get(k) for k in keys}
    assert (s["step"], s["phase"], s["op"]) == (8, "loss", "Square")
    assert [step["loss"] for step in sentinel["steps"]] == [step["loss"] for step in full["steps"]]
    assert sentinel["steps_run"] == full["steps_run"] == 9
    # The rules see every step's loss, gradient norm, weight norm and update ratio as in full mode; only the layer
    # outputs' growth over the steps (bounded-activation's trend) needs the layer rows that light steps leave out.
    full_ids = [r["id"] for r in full["recommendations"]]
    assert [r["id"] for r in sentinel["recommendations"]] == [i for i in full_ids if i != "bounded-activation"]
    assert {"lower-learning-rate", "weight-constraint", "bounded-activation"} <= set(full_ids)
    assert any(note.startswith("mode=sentinel: full statistics on every 100th step") for note in sentinel["notes"])
    assert not any(note.startswith("mode=sentinel") for note in full["notes"])
