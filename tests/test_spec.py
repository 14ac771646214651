"""The run spec: valid specs load, invalid ones fail with one line naming file, field and value."""

import pytest

from nanscope.errors import SpecError
from nanscope.spec.load import apply_overrides, load_spec, parse_spec

BASE = {"model": {"factory": "m.py:build"}, "data": {"synthetic": {"kind": "regression"}}}


def test_defaults_and_paths_relative_to_the_spec(tmp_path):
    path = tmp_path / "sub" / "run.yaml"
    path.parent.mkdir()
    path.write_text("model: {factory: m.py:build}\ndata: {synthetic: {kind: regression}}\ntrain: {loss: mse}\n")
    spec = load_spec(path)
    assert spec.train.steps == 100 and spec.data.batch_size == 32
    assert spec.resolve("m.py") == tmp_path / "sub" / "m.py"
    assert spec.train.loss.name == "mse"


@pytest.mark.parametrize("document,expected", [
    ({**BASE, "data": {"synthetic": {"kind": "regression"}, "batchsize": 3}}, "did you mean `batch_size`"),
    ({**BASE, "data": {"synthetic": {"kind": "regression"}, "batch_size": 0}}, "batch_size=0"),
    ({**BASE, "train": {"steps": -1}}, "steps=-1"),
    ({**BASE, "train": {"optimizer": {"clipnorm": 1, "clipvalue": 1}}}, "at most one of"),
    ({**BASE, "trian": {}}, "did you mean `train`"),
    ({"model": {"factory": "a:b", "path": "x"}, "data": BASE["data"]}, "exactly one of `factory` or `path`"),
    ({"model": BASE["model"]}, "missing field `data`"),
    ([1, 2], "must be a mapping"),
    (None, "empty"),
])
def test_invalid_specs_name_the_field(document, expected):
    with pytest.raises(SpecError) as error:
        parse_spec(document, source="run.yaml")
    message = str(error.value)
    assert message.startswith("run.yaml: ") and expected in message and "\n" not in message


def test_yaml_errors_name_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: {factory: [\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML: .* line \d+"):
        load_spec(path)


def test_overrides():
    spec = apply_overrides(parse_spec(BASE, "s.yaml"), steps=7, learning_rate=0.5, batch_size=4, seed=9)
    assert (spec.train.steps, spec.train.optimizer.learning_rate, spec.data.batch_size, spec.train.seed) == (7, 0.5, 4,
                                                                                                             9)
    with pytest.raises(SpecError, match="steps"):
        apply_overrides(spec, steps=0)
