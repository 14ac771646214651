"""tf.distribute: trace-steps and the callback under MirroredStrategy on two logical CPUs.

Two logical CPUs must be configured before TensorFlow starts its devices, and this
process has started them already, so the distributed runs are subprocesses with
NANSCOPE_CPU_REPLICAS=2: two in all, since each pays 7 s of CPU to start TensorFlow. One runs
every scenario but one (the `mirrored` fixture); the rollback test keeps a real `python -m nanscope` run
for the exit code and the printed report.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from nanscope.errors import SpecError
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs" / "distribute"


def run_two_replicas(args, tmp_path, timeout=120, **env):
    env = {**os.environ, "NANSCOPE_CPU_REPLICAS": "2", "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """Every run on two replicas but the rollback CLI run, in one process (specs/distribute/verdicts.py): the
    trace-steps scenarios, the fits of fit_guard.py and fit_callback.py, and three trace-steps runs through the
    CLI's `main`. TensorFlow starts once for them all."""
    folder = tmp_path_factory.mktemp("mirrored")
    done = run_two_replicas([str(SPECS / "verdicts.py"), "cli-healthy", "cli-nan", "cli-sentinel", "planted",
                             "planted-unguarded", "transient", "diverging", "skip", "clean", "fit-callback",
                             "fit-skip", "fit-clean", "fit-verdicts", "fit-rollback", "fit-plain", "fit-default"],
                            folder, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mirrored_run_matches_one_device(mirrored, tmp_path):
    done, report = mirrored["cli-healthy"]["exit"], mirrored["cli-healthy"]["report"]
    assert done == 0, report["notes"]
    assert report["status"] == "healthy"
    assert report["run"]["distribute"] == {"strategy": "MirroredStrategy", "replicas": 2}
    assert all(step["replica_nonfinite"] == [0, 0] for step in report["steps"])

    document = yaml.safe_load((SPECS / "healthy.yaml").read_text())
    document["train"].pop("distribute")
    spec = parse_spec(document, source=str(SPECS / "healthy.yaml"))
    single = run_trace(spec, TraceOptions(trace_path=tmp_path / "single.jsonl")).to_json()
    assert "distribute" not in single["run"] and "replica_nonfinite" not in single["steps"][0]
    # Same initial weights and batches, global_clipnorm on the summed gradient: the same training.
    for mirrored_step, alone in zip(report["steps"], single["steps"], strict=True):
        assert mirrored_step["loss"] == pytest.approx(alone["loss"], rel=1e-4)
        assert mirrored_step["grad_global_norm"] == pytest.approx(alone["grad_global_norm"], rel=1e-4)


def test_nan_rows_in_the_second_replica_are_attributed_to_it(mirrored):
    done, report = mirrored["cli-nan"]["exit"], mirrored["cli-nan"]["report"]
    assert done == 1
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["replica"]) == (1, "data", 1)
    assert "dataset rows 28" in first["detail"][0]
    assert report["steps"][0]["replica_nonfinite"] == [0, 0]
    healthy_half, bad_half = report["steps"][1]["replica_nonfinite"]
    assert healthy_half == 0 and bad_half > 0
    assert report["steps"][1]["x_nonfinite"] == 1


def test_callback_under_mirrored_strategy(mirrored):
    seen = dict(mirrored["fit-callback"])
    report = seen.pop("report")
    assert seen == {"replicas": 2, "steps": [0, 1], "train_step_restored": True}
    assert report["run"]["distribute"]["replicas"] == 2
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["replica"]) == (1, "data", 1)
    assert report["steps"][1]["replica_nonfinite"][0] == 0 and report["steps"][1]["replica_nonfinite"][1] > 0


@pytest.mark.parametrize("train, field", [({"jit_compile": True}, "jit_compile"),
                                          ({"mixed_precision": "mixed_float16"}, "mixed_precision")])
def test_settings_mirrored_cannot_run_are_bad_input(train, field):
    document = yaml.safe_load((SPECS / "healthy.yaml").read_text())
    document["train"].update(train)
    spec = parse_spec(document, source=str(SPECS / "healthy.yaml"))
    with pytest.raises(SpecError, match=f"train.{field}"):
        open_session(spec)


@pytest.fixture(scope="module")
def verdicts(mirrored):
    """The trace-steps scenarios of specs/distribute/verdicts.py."""
    return mirrored


def verdict(first):
    """The verdicts' fields of a first_nonfinite (None where the JSON leaves one out)."""
    keys = ("step", "phase", "replica", "reproducible", "origin", "reproducible_replicas", "origin_replicas")
    return {key: first.get(key) for key in keys}


def test_mirrored_a_planted_nan_row_reproduces_on_its_replica_and_comes_from_the_batch(verdicts):
    run = verdicts["planted"]
    assert verdict(run["first_nonfinite"]) == {"step": 3, "phase": "data", "replica": 1, "reproducible": True,
                                               "origin": "batch", "reproducible_replicas": [1], "origin_replicas": [1]}
    assert "reproducible: re-run from the state before step 3 on its batch, it is non-finite again (data pass) on " \
           "replica 1: deterministic" in " ".join(run["notes"])
    assert "origin: batch: from the state before step 0 the same batch is non-finite too (data pass) on replica 1" \
        in run["notes"]
    # The re-runs leave the run as it was: the same losses as without the guard.
    assert run["losses"] == verdicts["planted-unguarded"]["losses"]
    assert "reproducible_replicas" not in verdicts["planted-unguarded"]["first_nonfinite"]


def test_mirrored_a_transient_fault_on_one_replica_does_not_reproduce(verdicts):
    run = verdicts["transient"]
    assert verdict(run["first_nonfinite"]) == {"step": 3, "phase": "forward", "replica": 1, "reproducible": False,
                                               "origin": None, "reproducible_replicas": [], "origin_replicas": None}
    assert run["first_nonfinite"]["layer"] == "flaky" and "origin_replicas" not in run["first_nonfinite"]
    assert any(note.startswith("reproducible: no: re-run from the state before step 3 on its batch, it stays finite "
                               "on every replica (nondeterminism or a transient fault, seen on replica 1)")
               for note in run["notes"])
    assert "origin: not checked: the step did not reproduce" in run["notes"]


def test_mirrored_a_diverging_learning_rate_comes_from_the_state(verdicts):
    run = verdicts["diverging"]
    assert verdict(run["first_nonfinite"]) == {"step": 6, "phase": "forward", "replica": 0, "reproducible": True,
                                               "origin": "state", "reproducible_replicas": [0, 1],
                                               "origin_replicas": []}
    assert "origin: state: from the state before step 4 the same batch stays finite on every replica: the model's " \
           "state drifted (learning rate, optimizer moments)" in run["notes"]


def test_mirrored_skip_undoes_the_whole_step_optimizer_state_included(verdicts):
    # Adam's moments and counter are kept with the weights on every device: the steps after a skip train as the
    # run without the poisoned batch, exactly (before, the optimizer's copy was never taken under the strategy and
    # a skip put back its values from before step 0: step 5's loss was 0.3793, not 0.3861).
    run, clean = verdicts["skip"], verdicts["clean"]
    assert [(i["step"], i["action"]) for i in run["interventions"]] == [(3, "skip"), (7, "skip")]
    assert [loss for step, loss in enumerate(run["losses"]) if step not in (3, 7)] == clean["losses"]


def test_mirrored_rollback_gives_the_verdicts_in_the_json_and_the_printed_report(tmp_path):
    report = tmp_path / "report.json"
    done = run_two_replicas(["-m", "nanscope", "trace-steps", str(SPECS / "nan-second-half.yaml"), "--on-nonfinite",
                             "rollback", "--json", str(report), "--trace", str(tmp_path / "trace.jsonl")],
                            tmp_path, COLUMNS="160")
    assert done.returncode == 1, done.stderr[-2000:]
    document = json.loads(report.read_text())
    assert verdict(document["first_nonfinite"]) == {"step": 1, "phase": "data", "replica": 1, "reproducible": True,
                                                    "origin": "batch", "reproducible_replicas": [1],
                                                    "origin_replicas": [1]}
    assert [(i["step"], i["action"], i["restored_step"]) for i in document["interventions"]] == [(1, "rollback", 0)]
    printed = " ".join(done.stdout.split())
    assert "reproducible yes: non-finite again from the state before it on replica 1 (deterministic)" in printed
    assert "origin batch: non-finite from an earlier state too on replica 1 (the data)" in printed


def test_mirrored_sentinel_mode_runs_every_step_in_full(mirrored):
    # The light step, inherited from the one-device step, would train outside `strategy.run` (before, it did: the
    # steps after the first had no per-replica counts).
    done, document = mirrored["cli-sentinel"]["exit"], mirrored["cli-sentinel"]["report"]
    assert done == 0, document["notes"]
    assert [step["replica_nonfinite"] for step in document["steps"]] == [[0, 0]] * 6
    assert "mode=sentinel: not under train.distribute; every step was recorded in full" in document["notes"]


@pytest.fixture(scope="module")
def fit_guard(mirrored):
    """The fits of specs/distribute/fit_guard.py (the callback's guard under MirroredStrategy) and their reports."""
    fits = {name: mirrored[f"fit-{name}"] for name in ("skip", "clean", "verdicts", "rollback", "plain", "default")}
    reports = {name: fits[name]["report"] for name in ("skip", "verdicts", "rollback", "default")}
    return fits, reports


def test_fit_under_mirrored_strategy_skips_a_poisoned_batch_and_trains_as_without_it(fit_guard):
    # Each replica's weights, Adam's moments and counter and the metrics' totals are put back on its own device:
    # every epoch trains as the fit without that batch's 16 rows (before, the guard kept no state under a strategy
    # and stopped the run at the first non-finite step, in epoch 0).
    fits, reports = fit_guard
    run, clean = fits["skip"], fits["clean"]
    assert run["epochs"] == 3 and run["train_step_restored"]
    assert run["loss"] == pytest.approx(clean["loss"], rel=1e-6, abs=0)
    assert run["mae"] == pytest.approx(clean["mae"], rel=1e-6, abs=0)
    for weights, expected in zip(run["weights"], clean["weights"], strict=True):
        np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-7)
    report = reports["skip"]
    assert [(i["step"], i["action"], i["reason"]) for i in report["interventions"]] == [
        (1, "skip", "non-finite data pass"), (5, "skip", "non-finite data pass"), (9, "skip", "non-finite data pass")]
    assert not any("cannot skip" in note or "no state is kept" in note for note in report["notes"])
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["replica"], first["reproducible"], first["reproducible_replicas"]) \
        == (1, "data", 1, True, [1])


def test_fit_under_mirrored_strategy_a_planted_nan_row_reproduces_on_its_replica_and_comes_from_the_batch(fit_guard):
    fits, reports = fit_guard
    report = reports["verdicts"]
    assert verdict(report["first_nonfinite"]) == {"step": 2, "phase": "data", "replica": 1, "reproducible": True,
                                                  "origin": "batch", "reproducible_replicas": [1],
                                                  "origin_replicas": [1]}
    assert "origin: batch: from the state before step 1 the same batch is non-finite too (data pass) on replica 1" \
        in report["notes"]
    assert any(note.startswith("reproducible: re-run from the state before step 2 on its batch, it is non-finite "
                               "again (data pass) on replica 1: deterministic") for note in report["notes"])
    # The default mode stops after the step; the re-runs leave its losses as they were.
    assert fits["verdicts"]["epochs"] == 1 and report["interventions"] == []


def test_fit_under_mirrored_strategy_rolls_back_from_the_ring_and_lowers_the_learning_rate(fit_guard):
    fits, reports = fit_guard
    run = fits["rollback"]
    assert run["epochs"] == 2 and all(np.isfinite(w).all() for w in map(np.asarray, run["weights"]))
    assert all(np.isfinite(run["loss"]))
    rollbacks = reports["rollback"]["interventions"]
    # Step 1: no earlier state yet (the one before it is put back); step 5: the ring's state before step 4.
    assert [(i["step"], i["action"], i["restored_step"]) for i in rollbacks] == [(1, "rollback", 1), (5, "rollback", 4)]
    assert [i["learning_rate"][0]["after"] for i in rollbacks] == pytest.approx([1e-3, 1e-4], rel=1e-5)


def test_fit_under_mirrored_strategy_the_default_mode_keeps_no_state_and_trains_as_without_nanscope(fit_guard):
    fits, reports = fit_guard
    assert fits["default"]["loss"] == fits["plain"]["loss"]
    assert fits["default"]["weights"] == fits["plain"]["weights"]
    assert "verdicts: not checked: no state is kept (under tf.distribute it is kept, per replica, only under " \
           "on_nonfinite='skip' or 'rollback', skip_spikes=True or snapshot_every=N)" in reports["default"]["notes"]
