"""tf.distribute: trace-steps and the callback under MirroredStrategy on two logical CPUs.

Two logical CPUs must be configured before TensorFlow starts its devices, and this
process has started them already, so the distributed runs are subprocesses with
NANSCOPE_CPU_REPLICAS=2.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nanscope.errors import SpecError
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs" / "distribute"


def run_two_replicas(args, tmp_path):
    env = {**os.environ, "NANSCOPE_CPU_REPLICAS": "2", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def trace_two_replicas(spec_name, tmp_path):
    report = tmp_path / "report.json"
    done = run_two_replicas(["-m", "nanscope", "trace-steps", str(SPECS / spec_name), "--json", str(report),
                             "--trace", str(tmp_path / "trace.jsonl")], tmp_path)
    assert report.exists(), done.stderr[-2000:]
    return done, json.loads(report.read_text())


def test_mirrored_run_matches_one_device(tmp_path):
    done, report = trace_two_replicas("healthy.yaml", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["status"] == "healthy"
    assert report["run"]["distribute"] == {"strategy": "MirroredStrategy", "replicas": 2}
    assert all(step["replica_nonfinite"] == [0, 0] for step in report["steps"])

    document = yaml.safe_load((SPECS / "healthy.yaml").read_text())
    document["train"].pop("distribute")
    spec = parse_spec(document, source=str(SPECS / "healthy.yaml"))
    single = run_trace(spec, TraceOptions(trace_path=tmp_path / "single.jsonl")).to_json()
    assert "distribute" not in single["run"] and "replica_nonfinite" not in single["steps"][0]
    # Same initial weights and batches, global_clipnorm on the summed gradient: the same training.
    for mirrored, alone in zip(report["steps"], single["steps"], strict=True):
        assert mirrored["loss"] == pytest.approx(alone["loss"], rel=1e-4)
        assert mirrored["grad_global_norm"] == pytest.approx(alone["grad_global_norm"], rel=1e-4)


def test_nan_rows_in_the_second_replica_are_attributed_to_it(tmp_path):
    done, report = trace_two_replicas("nan-second-half.yaml", tmp_path)
    assert done.returncode == 1
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["replica"]) == (1, "data", 1)
    assert "dataset rows 28" in first["detail"][0]
    assert report["steps"][0]["replica_nonfinite"] == [0, 0]
    healthy_half, bad_half = report["steps"][1]["replica_nonfinite"]
    assert healthy_half == 0 and bad_half > 0
    assert report["steps"][1]["x_nonfinite"] == 1


def test_callback_under_mirrored_strategy(tmp_path):
    report_path = tmp_path / "fit.json"
    done = run_two_replicas([str(SPECS / "fit_callback.py"), str(report_path)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"replicas": 2, "steps": [0, 1], "train_step_restored": True}
    report = json.loads(report_path.read_text())
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
