"""compare-clipping's fix: the YAML and the Python each strategy's recommendation gives, exactly, per kind, with
and without loss scaling, against `golden/clipping_snippets.json` (regenerate it with
`NANSCOPE_REGENERATE_GOLDEN=1 pytest tests/test_boundaries_snippets.py` after an intended change, and review
the diff). A snippet that sets the wrong option or forgets to unscale a scaled gradient is a wrong fix."""

import json
import os
from pathlib import Path

import pytest

from nanscope.run.clipping.strategies import Strategy
from nanscope.run.clipping.verdict import fix_snippets

GOLDEN = Path(__file__).parent / "golden" / "clipping_snippets.json"
KINDS = ("none", "clipnorm", "clipvalue", "global_clipnorm", "manual_clip_by_norm", "manual_clip_by_global_norm",
         "auto")
OPTIMIZERS = {"adam": {"name": "adam", "learning_rate": 0.001, "clipnorm": 5.0, "beta_1": None},
              "rmsprop": {"name": "RMSprop", "learning_rate": 0.01}, "custom": {"name": "Lion"}, "none": None}
CASES = [f"{kind} {optimizer}{' scaled' if scaled else ''}" for kind in KINDS for optimizer in OPTIMIZERS
         for scaled in (False, True)]


def snippets(case):
    kind, optimizer, *scaled = case.split()
    yaml_text, code = fix_snippets(Strategy(kind, None if kind == "none" else 0.5), OPTIMIZERS[optimizer],
                                   loss_scaling=bool(scaled))
    return {"yaml": yaml_text, "code": code}


def test_regenerate_the_golden_file_when_asked():
    if not os.environ.get("NANSCOPE_REGENERATE_GOLDEN"):
        pytest.skip("set NANSCOPE_REGENERATE_GOLDEN=1 to rewrite golden/clipping_snippets.json")
    GOLDEN.write_text(json.dumps({case: snippets(case) for case in CASES}, indent=1) + "\n", encoding="utf-8")


@pytest.mark.parametrize("case", CASES)
def test_each_strategy_gives_the_fix_the_golden_file_holds(case):
    assert snippets(case) == json.loads(GOLDEN.read_text(encoding="utf-8"))[case]


def test_the_options_the_snippets_set():
    # A Keras option sets itself; a manual clip by norm is clipnorm in the spec; the global ones global_clipnorm.
    assert snippets("clipvalue adam")["yaml"] == "train:\n  optimizer: {clipvalue: 0.5}"
    assert snippets("manual_clip_by_norm adam")["yaml"] == "train:\n  optimizer: {clipnorm: 0.5}"
    assert snippets("auto adam")["yaml"] == "train:\n  optimizer: {global_clipnorm: 0.5}"
    # The optimizer's own arguments are kept, its clipping ones and the unset ones dropped.
    assert snippets("clipnorm adam")["code"] == "optimizer = keras.optimizers.Adam(learning_rate=0.001, clipnorm=0.5)"
    assert snippets("none adam")["code"] is None
