"""The guard in `trace-steps`: skip a poisoned batch exactly, roll back a diverging run, from the CLI too."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from nanscope.guard import GuardOptions

from dense_runs import BATCH
from dense_runs import trace_dense as trace
from data_factories import arrays


def test_skip_leaves_out_the_poisoned_batch_and_trains_as_the_run_without_it(tmp_path):
    x, y = arrays(rows=64)
    poisoned = x.copy()
    poisoned[2 * BATCH + 5, 1] = np.nan  # batch 2 of each pass over the 4 batches: steps 2, 6, 10
    kept = np.r_[0:2 * BATCH, 3 * BATCH:64]
    (tmp_path / "clean").mkdir()
    clean = trace(tmp_path / "clean", x[kept], y[kept], steps=9)
    report = trace(tmp_path, poisoned, y, steps=12, keep_going=True, guard=GuardOptions(on_nonfinite="skip"))

    assert [(i["step"], i["action"]) for i in report.interventions] == [(2, "skip"), (6, "skip"), (10, "skip")]
    assert report.interventions[0] == {"step": 2, "action": "skip", "reason": "non-finite data pass", "skips": 1,
                                       "consecutive": 1}
    # Each loss is taken before the step's update: the same losses on the other steps mean the same weights and
    # optimizer state (Adam's moments and counter) before each of them.
    losses = [r.loss for r in report.records if r.step not in (2, 6, 10)]
    np.testing.assert_allclose(losses, [r.loss for r in clean.records], rtol=1e-6)
    assert report.first_nonfinite.step == 2 and report.steps_run == 12
    assert "guard: skip at 3 step(s): 2, 6, 10 (`interventions` in the JSON)" in report.notes
    assert report.to_json()["interventions"][2]["step"] == 10


def test_skip_stops_the_run_past_max_skips(tmp_path):
    x, y = arrays(rows=64)
    x[BATCH:, 0] = np.nan  # every batch from batch 1 on
    report = trace(tmp_path, x, y, steps=8, keep_going=True,
                   guard=GuardOptions(on_nonfinite="skip", max_skips=(2, 10)))
    assert [(i["step"], i["action"]) for i in report.interventions] == [(1, "skip"), (2, "skip"), (3, "stop")]
    assert report.steps_run == 4
    assert "guard: stopped the run: non-finite data pass; max_skips reached (2 consecutive)" in report.notes


def test_trace_steps_rolls_back_a_diverging_run_and_applies_the_fix_proven_on_the_rolled_back_steps(tmp_path):
    spec = "configs/exploding-regression.yaml"
    run = [sys.executable, "-m", "nanscope", "trace-steps", spec, "--trace", str(tmp_path / "t.jsonl"),
           "--json", str(tmp_path / "r.json"), "--steps", "60"]
    done = subprocess.run([*run, "--on-nonfinite", "rollback"], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr  # a run that found a NaN, kept alive
    report = json.loads((tmp_path / "r.json").read_text())
    rollbacks = [i for i in report["interventions"] if i["action"] == "rollback"]
    assert [(i["step"], i["restored_step"]) for i in rollbacks] == [(8, 0)]
    # The rules' first in-process fix, clipping at the threshold the clip-gradients finding computed, is tried on
    # steps 0-8 from the restored state: they stay finite and their batches' loss falls, so it is applied.
    tried = rollbacks[0]["fixes_tried"]
    assert [(t["fix"], t["rule"]) for t in tried] == [("global_clipnorm=7", "clip-gradients")]
    fix = rollbacks[0]["fix"]
    assert (fix["rule"], fix["name"], fix["params"]) == ("clip-gradients", "global_clipnorm=7", {"global_clipnorm": 7})
    assert fix["why"].startswith("steps 0-8 again from the restored state with it: finite, and it learns")
    assert "learning_rate" not in rollbacks[0] and "learning_rate_changed" not in report["run"]  # not lowered
    assert any(note.startswith("guard: the rollback at step 8 applied global_clipnorm=7 (clip-gradients)")
               for note in report["notes"])
    losses = [float(step["loss"]) for step in report["steps"]]
    assert report["steps_run"] == len(losses) == 60 and all(math.isfinite(v) for v in losses[-40:])
    assert np.mean(losses[-10:]) < 0.5 * losses[0]  # it goes on learning at the lower rate
    assert report["first_nonfinite"]["reproducible"] is True


def test_rollback_lowers_the_learning_rate_without_apply_fix_or_a_proven_fix(tmp_path):
    x, y = arrays(rows=64, target_scale=10.0)

    def rollback(**guard):
        report = trace(tmp_path, x, y, 12, optimizer={"name": "sgd", "learning_rate": 0.3},
                       trace_path=tmp_path / "t.jsonl", keep_going=True,
                       guard=GuardOptions(on_nonfinite="rollback", **guard))
        return next(i for i in report.interventions if i["action"] == "rollback")

    fixed, lowered = rollback(), rollback(apply_fix=False)
    assert (fixed["step"], fixed["restored_step"], fixed["fix"]["name"]) == (7, 0, "global_clipnorm=0.06")
    assert "learning_rate" not in fixed
    assert (lowered["step"], lowered["restored_step"]) == (7, 0) and "fix" not in lowered
    assert lowered["learning_rate"] == [{"before": pytest.approx(0.3), "after": pytest.approx(0.03)}]
