"""The realistic corpus: no false alarms on healthy runs, the right rule on buggy ones, precision and recall.

Whether a case is healthy or buggy is established with plain Keras and numpy, not with
nanscope: the same model, data, loss and optimizer trained by `model.fit` either stays
finite while its loss falls (healthy) or goes non-finite, diverges, or stays finite and learns
nothing with a layer past its dtype's bound (buggy); bugs in the data are shown with numpy.
nanscope must then give a healthy case no finding at warning or error level, and rank a buggy case's expected
rule in its top 2 at warning or error level. The last test prints precision and recall
over the corpus (the README quotes them). Every buggy case's printed top fix is then run as
code on the case (`fixing.py`) and must train: stay finite and end at least 1% below the loss
of the best constant prediction; the share that does is printed too.
"""

import functools
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from rich.console import Console

from nanscope.model.factory import load_callable
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow
from nanscope.run.environment import dtype_policy
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("realistic_cases", HERE / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
_spec = importlib.util.spec_from_file_location("realistic_generative", cases.GENERATIVE)
generative = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generative)
_spec = importlib.util.spec_from_file_location("realistic_fixing", HERE / "fixing.py")
fixing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixing)
ALARMS = ("warning", "error")
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """nanscope's report of every case, run once."""
    folder = tmp_path_factory.mktemp("corpus")
    docs = {**cases.HEALTHY, **{name: doc for name, (doc, _) in cases.BUGGY.items()}}
    return {name: run_trace(parse_spec(doc, source=str(folder / f"{name}.yaml")),
                            TraceOptions(trace_path=folder / f"{name}.jsonl"))
            for name, doc in docs.items()}


FIT_EPOCHS, FIT_BATCH = 3, 16


@pytest.fixture(scope="module")
def fit_runs(tmp_path_factory):
    """{case: (plain fit's history, the NanScope callback's report)} of every train_step case, each fit once."""
    folder = tmp_path_factory.mktemp("fit-corpus")
    found = {}
    for name, (factory, scale) in {**cases.FIT_HEALTHY, **{n: c for n, (c, _) in cases.FIT_BUGGY.items()}}.items():
        x = generative.images(scale=scale)
        plain = getattr(generative, factory)().fit(x, epochs=FIT_EPOCHS, batch_size=FIT_BATCH, verbose=0).history
        callback = NanScope(report=folder / f"{name}.json", console=Console(quiet=True))
        getattr(generative, factory)().fit(x, epochs=FIT_EPOCHS, batch_size=FIT_BATCH, verbose=0, callbacks=[callback])
        found[name] = plain, json.loads((folder / f"{name}.json").read_text())
    return found


def fit_alarms(report):
    return [r["id"] for r in report["recommendations"] if r["severity"] in ALARMS]


def plain_fit_losses(doc):
    """Per-epoch training losses of plain `model.fit` on the case's model, data, loss and optimizer."""
    return plain_fit(doc)[0]


def plain_fit(doc):
    """(per-epoch training losses, the trained model) of plain `model.fit` on the case's model, data, loss and
    optimizer."""
    keras.utils.set_random_seed(doc["train"]["seed"])
    x, y = _call(doc["data"]["factory"], doc["data"]["args"])
    with dtype_policy(doc["train"].get("mixed_precision")):
        keras.utils.set_random_seed(doc["train"]["seed"])
        model = _call(doc["model"]["factory"], doc["model"]["args"])
        optimizer = dict(doc["train"]["optimizer"])
        model.compile(OPTIMIZERS[optimizer.pop("name")](**optimizer), _loss(doc["train"]["loss"]))
    rows = len(next(iter(x.values())) if isinstance(x, dict) else x)
    epochs = math.ceil(doc["train"]["steps"] / math.ceil(rows / doc["data"]["batch_size"]))
    history = model.fit(x, y, batch_size=doc["data"]["batch_size"], epochs=epochs, shuffle=False, verbose=0)
    return history.history["loss"], model


def _call(reference, args):
    return load_callable(reference, HERE, "test")(**args)


def _loss(loss):
    if isinstance(loss, dict) and "name" in loss:
        return functools.partial(keras.losses.get(loss["name"]), from_logits=loss.get("from_logits", False))
    if isinstance(loss, dict):
        return {name: _loss(one) for name, one in loss.items()}
    return load_callable(loss, HERE, "test") if ".py:" in loss else loss


def alarms(report):
    return [r.id for r in report.recommendations if r.severity in ALARMS]


@pytest.mark.parametrize("name", sorted(cases.HEALTHY))
def test_a_healthy_case_trains_and_gets_no_alarm(name, reports):
    losses = plain_fit_losses(cases.HEALTHY[name])
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses  # plain Keras: it learns
    report = reports[name]
    assert report.first_nonfinite is None and alarms(report) == [], [(r.id, r.evidence) for r in report.recommendations]


def _robust_z(y):
    median = np.median(y)
    return np.abs(y - median) / (1.4826 * np.median(np.abs(y - median)))


# Bugs in the data are established with numpy (plain `fit` may even stay finite on a NaN
# feature: a relu can turn NaN into 0 on some CPU kernels); the others with plain `fit`.
DATA_BUGS = {
    "nan-feature-row": lambda x, y: np.isnan(x).any(),
    "missing-value-code-9999": lambda x, y: 0 < (_robust_z(y) > 10).sum() <= 0.01 * len(y),
}


def first_batch_gradients_finite(doc):
    """Whether a plain GradientTape step on the first batch gives finite gradients (MSE loss)."""
    keras.utils.set_random_seed(doc["train"]["seed"])
    x, y = _call(doc["data"]["factory"], doc["data"]["args"])
    keras.utils.set_random_seed(doc["train"]["seed"])
    model = _call(doc["model"]["factory"], doc["model"]["args"])
    batch = doc["data"]["batch_size"]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x[:batch]) - y[:batch]))
    return all(bool(np.isfinite(g.numpy()).all()) for g in tape.gradient(loss, model.trainable_variables))


# A NaN gradient that plain `fit` does not show in its loss (it stayed finite here on TF 2.21's CPU
# kernels: the tf.where drops the NaN branch's value, and a relu of the NaN weights gives 0, so the norm
# of relu activations ends flat at the targets' variance) is established with a plain GradientTape step.
GRADIENT_BUGS = {"tf-where-gradient-trap", "norm-of-zero-activations"}


# A run that stays finite and learns nothing (its last epoch's loss not 1% below the best constant prediction's)
# because a relu layer's output passed float32's sqrt(max), 1.8e19, so the LayerNormalization after it squares it
# into inf and outputs a constant: case: that layer. Established with plain fit and the layer's output after it.
STALLED_BUGS = {"irnn-relu-state-growth": "rnn"}
SQRT_FLOAT32_MAX = math.sqrt(float(np.finfo(np.float32).max))


def stalled_past_the_bound(doc, layer):
    """Whether plain fit stays finite, ends at the best constant prediction's loss, and leaves `layer`'s output past
    float32's sqrt(max)."""
    losses, model = plain_fit(doc)
    x, y = _call(doc["data"]["factory"], doc["data"]["args"])
    baseline = fixing.best_constant(_loss(doc["train"]["loss"]), y, y.shape[-1])
    output = x
    for one in model.layers[:[one.name for one in model.layers].index(layer) + 1]:  # a Sequential up to `layer`
        output = one(output)
    peak = float(np.max(np.abs(output)))
    return all(math.isfinite(v) for v in losses) and losses[-1] >= (1 - fixing.MARGIN) * baseline and \
        peak > SQRT_FLOAT32_MAX


@pytest.mark.parametrize("name", sorted(cases.BUGGY))
def test_a_buggy_case_ranks_its_rule_in_the_top_2(name, reports):
    doc, expected = cases.BUGGY[name]
    if name in DATA_BUGS:
        assert DATA_BUGS[name](*_call(doc["data"]["factory"], doc["data"]["args"]))
    elif name in GRADIENT_BUGS:
        assert doc["train"]["loss"] == "mse" and not first_batch_gradients_finite(doc)
    elif name in STALLED_BUGS:
        assert stalled_past_the_bound(doc, STALLED_BUGS[name])
    else:  # plain Keras: the run goes non-finite, or ends far worse than predicting the targets' mean
        losses = plain_fit_losses(doc)
        _, y = _call(doc["data"]["factory"], doc["data"]["args"])
        assert not all(math.isfinite(v) for v in losses) or losses[-1] > 100 * np.var(y), losses
    top = [r.id for r in reports[name].recommendations if r.severity in ALARMS][:2]
    assert expected in top, [(r.id, r.severity, r.evidence) for r in reports[name].recommendations]


@pytest.mark.parametrize("name", sorted(cases.FIT_HEALTHY))
def test_a_healthy_train_step_model_trains_and_gets_no_alarm(name, fit_runs):
    plain, report = fit_runs[name]
    losses = next(iter(plain.values()))  # the VAE's loss, the GAN's d_loss
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], plain
    assert report["first_nonfinite"] is None and fit_alarms(report) == [], report["recommendations"]


@pytest.mark.parametrize("name", sorted(cases.FIT_BUGGY))
def test_unscaled_inputs_that_fail_at_once_rank_the_scale_above_the_ops_guard(name, fit_runs):
    # Root cause before symptom: the Exp (VAE) or the Log (GAN) gets the non-finite value, the raw inputs made it.
    plain, report = fit_runs[name]
    assert not all(math.isfinite(v) for v in next(iter(plain.values()))), plain  # plain Keras goes non-finite
    assert report["first_nonfinite"]["step"] == 0
    expected = cases.FIT_BUGGY[name][1]
    recs = [(r["id"], r["severity"]) for r in report["recommendations"]]
    assert recs[0] == (expected, "error"), recs
    assert recs[1] == ({"vae": "stable-exp", "gan": "stable-log"}[cases.FIT_BUGGY[name][0][0]], "error"), recs
    assert report["recommendations"][0]["data"]["root_cause"] is True
    # Its fix trains: the same model on the same images in 0-1 is the healthy case above, and it learns.
    fixed, _ = fit_runs[cases.FIT_FIXED[name]]
    assert next(iter(fixed.values()))[-1] < next(iter(fixed.values()))[0]


def test_corpus_size_and_distinct_causes():
    assert len(cases.HEALTHY) >= 12 and len(cases.BUGGY) >= 12
    assert len({spec["model"]["factory"] + str(spec["data"]["args"]) + str(spec["train"]) for spec, _ in
                cases.BUGGY.values()}) == len(cases.BUGGY)


def test_precision_and_recall_over_the_corpus(reports, fit_runs, capsys):
    hits = sum(expected in [r.id for r in reports[name].recommendations if r.severity in ALARMS][:2]
               for name, (_, expected) in cases.BUGGY.items())
    hits += sum(expected in fit_alarms(fit_runs[name][1])[:2] for name, (_, expected) in cases.FIT_BUGGY.items())
    false_alarms = sum(bool(alarms(reports[name])) for name in cases.HEALTHY)
    false_alarms += sum(bool(fit_alarms(fit_runs[name][1])) for name in cases.FIT_HEALTHY)
    healthy, buggy = len(cases.HEALTHY) + len(cases.FIT_HEALTHY), len(cases.BUGGY) + len(cases.FIT_BUGGY)
    precision = hits / (hits + false_alarms) if hits + false_alarms else 0.0
    recall = hits / buggy
    with capsys.disabled():
        print(f"\nrealistic corpus: {healthy} healthy, {buggy} buggy; "
              f"expected rule in the top 2: {hits}/{buggy}; healthy runs with an alarm: "
              f"{false_alarms}/{healthy}; precision {precision:.2f}, recall {recall:.2f}")
    assert precision == 1.0 and recall == 1.0
    assert np.isfinite(precision)


@pytest.fixture(scope="module")
def top_fixes(reports):
    """{buggy case: (its top fix's rule id, the fix as printed, the code run, fixing.outcome)}, each case's fix
    applied when first asked."""
    found = {}

    def top_fix(name):
        if name not in found:
            doc, _ = cases.BUGGY[name]
            top = next(r for r in reports[name].recommendations if r.severity in ALARMS)
            code = fixing.first_alternative(top.fix)
            run = fixing.apply(fixing.Run(doc, _call, _loss), cases.TOP_FIX_SITES[name], code)
            found[name] = top.id, top.fix, code, fixing.outcome(run)
        return found[name]

    return top_fix


def test_every_buggy_case_says_where_its_top_fix_goes():
    assert sorted(cases.TOP_FIX_SITES) == sorted(cases.BUGGY)


@pytest.mark.parametrize("name", sorted(cases.BUGGY))
def test_a_buggy_cases_printed_top_fix_trains(name, top_fixes):
    rule, fix, code, outcome = top_fixes(name)
    assert rule == cases.BUGGY[name][1], rule  # the fix of the rule the case plants
    site = cases.TOP_FIX_SITES[name]
    if site in ("model", "loss"):  # it is applied at the line the fix names: in the case's layer or its loss file
        assert {"model": "models.py:", "loss": "losses.py:"}[site] in fix.splitlines()[0], fix
    assert outcome["finite"] and outcome["trains"], (rule, code, outcome)


def test_share_of_buggy_cases_whose_top_fix_trains(top_fixes, fit_runs, capsys):
    trained = sorted(name for name in cases.BUGGY if top_fixes(name)[3]["trains"])
    # The train_step cases' top fix (normalize-inputs) applied as the images brought to 0-1: their healthy twins.
    fit_trained = [name for name in cases.FIT_BUGGY
                   if (lambda losses: losses[-1] < losses[0])(next(iter(fit_runs[cases.FIT_FIXED[name]][0].values())))]
    with capsys.disabled():
        print(f"\nrealistic corpus: the printed top fix, run as code, trains in {len(trained)}/{len(cases.BUGGY)} "
              f"buggy trace-steps cases ({len(trained) / len(cases.BUGGY):.0%}); the train_step cases' top fix "
              f"(inputs brought to 0-1) trains in {len(fit_trained)}/{len(cases.FIT_BUGGY)}; failing: "
              f"{sorted(set(cases.BUGGY) - set(trained)) or 'none'}")
    assert len(trained) == len(cases.BUGGY) and len(fit_trained) == len(cases.FIT_BUGGY)
