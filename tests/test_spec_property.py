"""Property: any YAML document either loads into a valid RunSpec or fails with a NanscopeError, nothing else."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope.errors import NanscopeError
from nanscope.spec.load import load_spec
from nanscope.spec.sections import RunSpec


VALID = {
    "model": {"factory": "models.py:build", "args": {"units": 4}},
    "data": {"synthetic": {"kind": "regression", "samples": 64, "features": 4}, "batch_size": 8,
             "validation": {"fraction": 0.25}},
    "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01, "clipnorm": 1.0}, "steps": 5},
}
KNOWN_NAMES = ["model", "data", "train", "factory", "path", "args", "synthetic", "kind", "samples", "features",
               "batch_size", "shuffle", "validation", "fraction", "loss", "optimizer", "name", "learning_rate",
               "clipnorm", "clipvalue", "global_clipnorm", "steps", "seed", "target", "x", "y", "jit_compile"]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from([*KNOWN_NAMES, "regression", "classification", "sgd", "mse", "a.py:f"]),
)
keys = st.one_of(st.sampled_from(KNOWN_NAMES), st.text(max_size=8), st.integers(-3, 3), st.booleans())
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)


def load_text(tmp_path, text):
    """Load a spec text; return the RunSpec or the NanscopeError. Anything else propagates and fails the test."""
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_spec(path)
    except NanscopeError as exc:
        assert str(exc).startswith(str(path)), str(exc)
        assert str(exc).strip(), "an empty error message"
        return exc
    assert isinstance(spec, RunSpec) and spec.source == str(path)
    RunSpec.model_validate(spec.model_dump())  # what loaded is itself valid
    return spec


@PROPERTY
@given(document=documents)
def test_any_document_loads_or_is_a_nanscope_error(tmp_path, document):
    load_text(tmp_path, yaml.safe_dump(document, allow_unicode=True))


@PROPERTY
@given(document=st.dictionaries(st.sampled_from(["model", "data", "train", "trian"]), documents, max_size=4))
def test_any_three_sections_load_or_are_a_nanscope_error(tmp_path, document):
    load_text(tmp_path, yaml.safe_dump(document, allow_unicode=True))


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))


@st.composite
def mutated_specs(draw):
    """The valid spec with one field replaced, removed or added somewhere."""
    document = yaml.safe_load(yaml.safe_dump(VALID))
    path = draw(st.sampled_from([p for p in _paths(document) if p]))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(documents)
    elif action == "remove":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(keys)] = draw(documents)
    return document


@PROPERTY
@given(document=mutated_specs())
def test_mutations_of_a_valid_spec_load_or_are_a_nanscope_error(tmp_path, document):
    load_text(tmp_path, yaml.safe_dump(document, allow_unicode=True))


@PROPERTY
@given(position=st.integers(0, 10_000), cut=st.integers(0, 8),
       insert=st.text(alphabet="{}[]:,-'\"!&*#|>%@` \n\t", max_size=4))
def test_text_mutations_load_or_are_a_nanscope_error(tmp_path, position, cut, insert):
    text = yaml.safe_dump(VALID, sort_keys=False)
    position %= len(text)
    load_text(tmp_path, text[:position] + insert + text[position + cut:])


def test_the_valid_spec_is_valid(tmp_path):
    assert isinstance(load_text(tmp_path, yaml.safe_dump(VALID)), RunSpec)
