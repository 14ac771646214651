"""Shared test set-up: quiet TensorFlow, spec files on disk, the real CLI."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
import yaml

from nanscope.runtime import tensorflow

tensorflow()


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec dict (and optional extra files) under tmp_path; return the spec path."""

    def write(spec, name="spec.yaml", files=None):
        for filename, text in (files or {}).items():
            (tmp_path / filename).write_text(text)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write
