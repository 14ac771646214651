"""Mixed precision: float16 layers, loss scaling, float16 overflow, a collapsed loss scale."""

import json
from pathlib import Path

from rich.console import Console

from nanscope.render.trace_report import render_trace_report
from nanscope.runtime import tensorflow
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"


def run(tmp_path, factory, steps=6, scale=1.0, policy="mixed_float16", verify=False, data="arrays", **data_args):
    document = {
        "model": {"factory": f"{SPECS / 'precision_models.py'}:{factory}"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:{data}", "batch_size": 16, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": steps, "seed": 0,
                  "mixed_precision": policy},
    }
    if scale != 1.0:
        data_args["scale"] = scale
    if data_args:
        document["data"]["args"] = data_args
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl", keep_going=not verify, verify=verify))


def test_float16_run_reports_dtypes_and_loss_scale_and_restores_the_policy(tmp_path):
    before = keras.mixed_precision.dtype_policy().name
    report = run(tmp_path, "mlp")
    assert keras.mixed_precision.dtype_policy().name == before
    assert report.run["layer_dtypes"] == {"hidden": "float16", "out": "float32"}
    assert report.run["loss_scaling"] is True
    assert all(r.loss_scale is not None and r.loss_scale > 0 for r in report.records)
    assert report.status == "healthy"
    layers = {row["name"]: row for row in report.to_json()["layers"]}
    assert layers["hidden"]["dtype"] == "float16"


def test_bfloat16_needs_no_loss_scaling(tmp_path):
    report = run(tmp_path, "mlp", policy="mixed_bfloat16")
    assert report.run["loss_scaling"] is False and report.run["layer_dtypes"]["hidden"] == "bfloat16"
    assert report.first_nonfinite is None


def test_float16_overflow_in_the_forward_pass(tmp_path):
    report = run(tmp_path, "mlp", scale=1e5)
    first = report.first_nonfinite
    assert first.phase == "forward" and first.layer == "hidden"
    ids = [r.id for r in report.recommendations]
    # A LossScaleOptimizer is already in use: loss scaling cannot help a forward overflow.
    assert "float32-layer" in ids[:3] and "loss-scaling" not in ids


def test_a_warm_up_shorter_than_thirty_skips_is_not_a_collapsed_loss_scale(tmp_path):
    """Every update skipped for 12 steps (the scale down to 2^3): still a plausible warm-up, as Keras 3's scale has
    no floor and raw inputs near 3000 skip 19 times before training; no finding, no failure."""
    report = run(tmp_path, "infinite_gradient", steps=12)
    assert all(r.update_skipped for r in report.records) and report.records[-1].loss_scale == 8.0
    assert report.first_nonfinite is None and report.recommendations == []


def test_skipped_updates_for_thirty_steps_are_a_collapsed_loss_scale_and_the_failure(tmp_path):
    """A gradient that is infinite at every scale: the 30th skip (every scale from 2^15 to 2^-15 tried) is the
    first non-finite step, replayed to the op, and the collapsed scale is an error finding."""
    report = run(tmp_path, "infinite_gradient", steps=40)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op) == (29, "backward", "SqrtGrad")
    assert all(r.phase is None for r in report.records[:29]) and report.records[29].phase == "backward"
    assert report.records[29].loss_scale_before == 2.0 ** -14 and report.records[29].scale_collapsed
    assert any("skipped most of the updates before it" in line for line in first.detail)
    ids = [r.id for r in report.recommendations]
    assert ids[0] == "safe-sqrt"  # the op that makes the gradient infinite at any scale
    scale = next(r for r in report.recommendations if r.id == "float32-layer")
    # keep_going: 40 steps; at 2^-24 the scaled gradients underflow to 0 and step 39's (zero) update is applied.
    assert scale.severity == "error" and not report.records[39].update_skipped
    assert ("the LossScaleOptimizer skipped 19 of the last 20 updates (steps 20-38): the gradients overflow float16 "
            "at every scale it tried") in scale.evidence
    assert "loss scale fell from 0.03125 to 5.96e-08; no weight changed on those steps" in scale.evidence
    assert "loss-scaling" not in [r.id for r in report.recommendations]


def test_a_forward_float16_overflow_without_loss_scaling_is_a_float32_layer_not_loss_scaling(tmp_path):
    # The overflow is in the forward pass, before any gradient: scaling the loss cannot prevent it (--verify's
    # loss-scaling run went non-finite at the same step, before #22), so the layer must compute in float32.
    report = run(tmp_path, "float16_layers", scale=1e5, policy=None, verify=True)
    assert report.run["loss_scaling"] is False and report.run["layer_dtypes"]["hidden"] == "float16"
    assert report.first_nonfinite.phase == "forward"
    ids = [r.id for r in report.recommendations if r.severity in ("warning", "error")]
    assert "float32-layer" in ids and "loss-scaling" not in ids
    rec = next(r for r in report.recommendations if r.id == "float32-layer")
    assert rec.severity == "error" and "dtype='float32'" in rec.fix
    assert any("before any gradient: loss scaling" in line for line in rec.evidence)


def test_skipped_updates_at_the_start_are_not_the_failure_a_later_float16_exp_overflow_is(tmp_path):
    """The LossScaleOptimizer's scale starts at 2^15: steps 0 and 1 overflow and are skipped (the scale halves),
    step 2 trains; batch 4 is 40x larger and its float16 Exp overflows in the forward pass."""
    report = run(tmp_path, "exp_late_overflow", data="late_spike", spike=40.0, target_scale=3.0)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (4, "forward", "exp", "Exp")
    skipped = [(r.step, r.loss_scale_before, r.loss_scale) for r in report.records if r.update_skipped]
    assert skipped[:2] == [(0, 32768.0, 16384.0), (1, 16384.0, 8192.0)]
    assert all(r.phase is None for r in report.records[:4]) and not report.records[2].update_skipped
    steps = {row["step"]: row for row in report.to_json()["steps"]}
    assert steps[0]["update_skipped"] is True and steps[0]["loss_scale_before"] == 32768.0
    assert steps[0]["loss_scale"] == 16384.0 and steps[0]["phase"] is None
    trace = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert next(line for line in trace if line.get("kind") == "step" and line["step"] == 0)["update_skipped"] is True
    ids = [r.id for r in report.recommendations]
    # The 40x batch puts the inputs' std past 10 (x[3]: 21.8) and the Exp overflows at step 4, near the initial
    # weights: the scale is the root cause and ranks first (#22 item 4); the op's guard, with float16's clamp at
    # 11.0, is the error after it. Loss scaling is not blamed for the warm-up's skips.
    assert ids[:2] == ["normalize-inputs", "stable-exp"] and "loss-scaling" not in ids
    assert report.recommendations[0].data["root_cause"] is True and report.recommendations[0].severity == "error"
    assert "tf.exp(tf.minimum(x, 11.0))" in report.recommendations[1].fix
    # The warm-up's skips are not a collapsed loss scale.
    assert not any("skipped" in line for rec in report.recommendations for line in rec.evidence)
    variables = {row["name"]: row["nonfinite_steps"] for row in report.to_json()["variables"]}
    assert set(variables.values()) == {1}  # only the failing step, not the skipped updates
    console = Console(width=120, record=True)
    render_trace_report(report, console)
    text = console.export_text()
    assert "skipped (scale 32768 -> 16384)" in text and "4 update(s) skipped" in text


def test_verify_does_not_credit_a_fix_that_stays_finite_by_skipping_every_update(tmp_path):
    """float16 layers without loss scaling, a gradient infinite at any scale: the loss-scaling fix stays finite
    only because the LossScaleOptimizer skips every update, and the last batch's loss (smaller targets) is below
    the first; that is not a fix."""
    report = run(tmp_path, "float16_infinite_gradient", steps=4, policy=None, verify=True, growth=0.3)
    assert report.first_nonfinite.phase == "backward"
    rec = next(r for r in report.recommendations if r.id == "loss-scaling")
    (row,) = rec.verification
    assert row["finite"] and row["final_loss"] < report.records[0].loss
    assert row["skipped_updates"] == 4 and row["stalled"] and not row["helped"] and rec.verified is False


def test_compare_clipping_under_mixed_float16_skipped_updates_are_not_failures_and_clipping_sees_true_gradients(
        tmp_path):
    """The exploding regression under mixed_float16: every strategy starts with skipped updates (the scale starts
    at 2^15); unclipped it goes non-finite at step 22 (a float16 MatMul overflows in the forward pass; step 20's
    update, skipped at a scale of 1, is still loss scaling at work), clipped it stays finite, and the clipping is
    judged on the updates that were applied, on the unscaled gradients."""
    from typer.testing import CliRunner

    from nanscope.cli import app

    repo = SPECS.parent.parent
    spec = tmp_path / "mixed.yaml"
    spec.write_text(
        (repo / "configs" / "exploding-regression.yaml").read_text()
        .replace("models.py:exploding_mlp", f"{repo / 'configs' / 'models.py'}:exploding_mlp")
        + "  mixed_precision: mixed_float16\n")
    out = tmp_path / "clip.json"
    result = CliRunner().invoke(app, ["compare-clipping", str(spec), "--steps", "30", "--json", str(out),
                                      "--strategies", "none,clipnorm,manual_clip_by_global_norm"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    runs = {s["name"]: s for s in doc["strategies"]}
    assert runs["none"]["first_nonfinite_step"] == 22 and runs["none"]["skipped_updates"] >= 1
    clipped = [s for name, s in runs.items() if name != "none"]
    for strategy in clipped:
        assert strategy["first_nonfinite_step"] is None and strategy["steps_run"] == 30, strategy["name"]
        assert strategy["skipped_updates"] >= 2 and not strategy["stalled"]
        effect = strategy["clip_effect"]
        # Judged on the applied updates only: the skipped ones' gradients were not finite.
        assert effect["took_effect"] is True and effect["steps_bit"] == effect["steps_within_threshold"] > 0
        assert effect["steps_bit"] <= 30 - strategy["skipped_updates"]
    # Thresholds come from the unclipped run's unscaled gradient norms (x 2^15 they would be ~1e5 and more).
    assert 0 < doc["thresholds"]["global_norm_bound"] < 100
    check = next(s for s in clipped if s["name"].startswith("clipnorm"))["clip_effect"]["optimizer_check"]
    assert check["verified"] is True and "LossScaleOptimizer" in check["detail"]
    assert doc["recommended"] in {s["name"] for s in clipped}
    assert any("skipped" in line for line in doc["recommendations"][0]["why"])
    assert "skipped" in result.stdout and "updates" in result.stdout


def test_the_manual_clipping_snippet_under_loss_scaling_clips_the_unscaled_gradients():
    """The verdict's training-script code, run as written in a loop with a LossScaleOptimizer: the update is the
    unscaled gradient clipped to the threshold (clipping the scaled one would move the weights 2^15 times less)."""
    import numpy as np

    from nanscope.run.clipping import Strategy
    from nanscope.run.clipping.verdict import fix_snippets

    strategy = Strategy("manual_clip_by_global_norm", 0.5)
    _, code = fix_snippets(strategy, {"name": "sgd", "learning_rate": 1.0}, loss_scaling=True)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    optimizer.build(model.trainable_variables)
    x, y = np.ones((4, 3), np.float32), np.full((4, 2), 10.0, np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    true_grads = [g / optimizer.dynamic_scale for g in grads]
    expected = [v.numpy() - g.numpy() for v, g in zip(model.trainable_variables,
                                                       tf.clip_by_global_norm(true_grads, 0.5)[0])]
    exec(code, {"tf": tf, "grads": grads, "optimizer": optimizer, "model": model})
    for variable, value in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-6)


def _raw_input_spec(tmp_path, steps):
    document = {
        "model": {"factory": f"{SPECS / 'precision_models.py'}:raw_input_mlp"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 64, "shuffle": False,
                 "args": {"rows": 1024, "scale": 3000.0, "target_scale": 1 / 3000}},
        "train": {"loss": "mse", "optimizer": {"name": "adam", "learning_rate": 0.001}, "steps": steps, "seed": 0,
                  "mixed_precision": "mixed_float16"},
    }
    return parse_spec(document, source=str(tmp_path / "spec.yaml"))


def test_a_loss_scale_below_one_with_updates_applied_is_a_healthy_run_in_trace_steps(tmp_path):
    """Raw inputs near 3000: the float16 kernel gradients overflow at a scale of 1, so Keras 3's LossScaleOptimizer
    (no floor) halves 19 times, to 2^-4, and then trains: 13 of 32 updates apply and the loss falls. Nothing failed."""
    report = run_trace(_raw_input_spec(tmp_path, 32), TraceOptions(trace_path=tmp_path / "t.jsonl"))
    skipped = [r.step for r in report.records if r.update_skipped]
    assert skipped == list(range(19)) and report.records[-1].loss_scale == 0.0625
    assert len(report.records) == 32 and report.first_nonfinite is None and report.status != "nan"
    assert report.records[-1].loss < report.records[19].loss / 2
    assert "float32-layer" not in [r.id for r in report.recommendations]


def test_the_callback_lets_fit_finish_a_run_whose_loss_scale_falls_below_one(tmp_path):
    """The same run under `fit` with the NanScope callback: fit runs its 2 epochs (32 steps), the report is healthy."""
    import sys

    import numpy as np

    from nanscope.keras import NanScope

    sys.path.insert(0, str(SPECS))
    try:
        from data_factories import arrays
        from precision_models import raw_input_mlp
    finally:
        sys.path.remove(str(SPECS))
    x, y = arrays(rows=1024, scale=3000.0, target_scale=1 / 3000)
    before = keras.mixed_precision.dtype_policy().name
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = raw_input_mlp()
        model.compile(keras.optimizers.Adam(0.001), "mse")
        scope = NanScope(report=tmp_path / "r.json", verbose=0)
        history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=[scope])
    finally:
        keras.mixed_precision.set_global_policy(before)
    assert len(history.history["loss"]) == 2 and not model.stop_training
    assert scope.report.first_nonfinite is None
    assert float(np.asarray(model.optimizer.dynamic_scale)) < 1
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["first_nonfinite"] is None and sum(s["update_skipped"] for s in doc["steps"]) == 19


def test_the_watch_marks_the_steps_at_which_the_collapsed_window_holds_over_the_steps_so_far():
    """LossScaleWatch, record by record, against `collapsed_window` over each prefix (the slow reference), on
    random runs of skips, unscaled steps and steps that failed before any gradient."""
    import numpy as np

    from nanscope.engine.loss_scale import LossScaleWatch, collapsed_window
    from nanscope.engine.records import StepRecord

    rng = np.random.default_rng(0)
    fired = 0
    for trial in range(300):
        steps = int(rng.integers(1, 70))
        warm_up = int(rng.integers(0, 40))
        rate = rng.choice([0.05, 0.5, 0.9, 1.0])
        skipped = (np.arange(steps) < warm_up) | (rng.random(steps) < rate)
        scaled, before = rng.random(steps) > 0.05, rng.random(steps) < 0.05
        watch, marked = LossScaleWatch(), []
        for step in range(steps):
            record = StepRecord(step, 1, 1.0, 1.0, 1.0, 1.0, 0, 0, 0, bool(before[step]), 0, 0,
                                loss_scale=1.0 if scaled[step] else None, update_skipped=bool(skipped[step]))
            watch.see(record)
            marked.append(record.scale_collapsed)
        expected = [bool(skipped[s]) and collapsed_window(skipped[:s + 1], scaled[:s + 1], before[:s + 1]) is not None
                    and scaled[s] and not before[s] for s in range(steps)]
        assert marked == expected, trial
        fired += any(marked)
    assert 50 < fired < 250  # both outcomes are exercised
