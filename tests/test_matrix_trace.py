"""The feature matrix for trace-steps (docs/matrix.md): alone, under `mirrored` and under `multi_worker`.

Per cell of tests/matrix_cells.py that a run spec can express: the run finishes, the report
prints within 80 columns, the JSON is right, and the step losses are those of the same
model trained in plain Keras (`train_on_batch` on the same batches from the same seed).
"""

import json
import os
import socket
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from typer.testing import CliRunner

from matrix_cells import CELLS, STEPS, plain_steps, run_spec
from nanscope.cli import app

SPEC_CELLS = [name for name, cell in CELLS.items() if cell.spec_optimizer is not None]
# Losses of a mixed-precision run agree to float16's / bfloat16's precision.
TOLERANCE = {"mixed_float16": 1e-3, "mixed_bfloat16": 1e-2}


def trace_steps(write_spec, tmp_path, document, *options):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["trace-steps", str(write_spec(document)), "--json", str(out),
                                      "--trace", str(tmp_path / "trace.jsonl"), *options])
    return result, json.loads(out.read_text()) if out.exists() else None


def assert_report_right(name, doc, printed, steps=STEPS):
    cell = CELLS[name]
    assert doc["status"] == "healthy" and doc["steps_run"] == steps, doc["notes"]
    assert not [note for note in doc["notes"] if "failed" in note], doc["notes"]
    run = doc["run"]
    assert run["optimizer"] == cell.optimizer_class
    assert run["mixed_precision"] == cell.policy and run["loss_scaling"] == (cell.policy == "mixed_float16")
    schedule = cell.spec_optimizer.get("learning_rate")
    if isinstance(schedule, dict):
        assert run["learning_rate_schedule"]["step"] == steps - 1
        assert run["learning_rate_schedule"]["class_name"] == schedule["class_name"].rpartition(":")[2]
    else:
        assert "learning_rate_schedule" not in run and run["optimizer_config"]["learning_rate"] == pytest.approx(
            schedule, rel=1e-6)
    assert "HEALTHY" in printed and max(len(line) for line in printed.splitlines()) <= 80


@pytest.mark.parametrize("name", SPEC_CELLS)
def test_trace_steps(name, write_spec, tmp_path):
    result, doc = trace_steps(write_spec, tmp_path, run_spec(name))
    assert result.exit_code == 0, result.output[-3000:]
    assert_report_right(name, doc, result.stdout)
    losses = [step["loss"] for step in doc["steps"]]
    np.testing.assert_allclose(losses, plain_steps(CELLS[name]), rtol=TOLERANCE.get(CELLS[name].policy, 1e-5))


def test_trace_steps_with_a_validation_part(write_spec, tmp_path):
    document = run_spec("exponential-decay+adamw")
    document["data"]["validation"] = {"fraction": 0.25}
    result, doc = trace_steps(write_spec, tmp_path, document)
    assert result.exit_code == 0, result.output[-3000:]
    assert_report_right("exponential-decay+adamw", doc, result.stdout)
    assert doc["run"]["train_rows"] == 48 and doc["run"]["validation_rows"] == 16
    assert np.isfinite(doc["validation_loss"])
    np.testing.assert_allclose([s["loss"] for s in doc["steps"]],
                               plain_steps(CELLS["exponential-decay+adamw"], rows=48), rtol=1e-5)


def run_process(args, tmp_path, env):
    return subprocess.run([sys.executable, "-m", "nanscope", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}, timeout=240, check=False)


@pytest.mark.parametrize("name", ["cosine-warmup+ema+global-clipnorm", "lstm+attention+custom-layer", "embedding+gru"])
def test_trace_steps_mirrored_trains_as_one_device(name, write_spec, tmp_path):
    path = write_spec(run_spec(name, distribute="mirrored"))
    done = run_process(["trace-steps", str(path), "--json", "r.json", "--trace", "t.jsonl"], tmp_path,
                       {"NANSCOPE_CPU_REPLICAS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"]["distribute"] == {"strategy": "MirroredStrategy", "replicas": 2}
    assert_report_right(name, doc, done.stdout)
    np.testing.assert_allclose([s["loss"] for s in doc["steps"]], plain_steps(CELLS[name]), rtol=1e-4)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def two_workers(args, folder, replicas=1):
    """Run `python args...` as the two tasks of a loopback cluster, `replicas` logical CPUs each;
    [(returncode, stdout, stderr)] per task."""
    ports = free_ports(2)
    processes = []
    for task in range(2):
        config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                             "task": {"type": "worker", "index": task}})
        env = {**os.environ, "TF_CONFIG": config, "TF_CPP_MIN_LOG_LEVEL": "3", "NANSCOPE_CPU_REPLICAS": str(replicas)}
        processes.append(subprocess.Popen([sys.executable, *[a.format(task=task) for a in args]], cwd=folder,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        done.append((process.returncode, out, err))
    return done


@pytest.mark.parametrize("name", ["cosine-warmup+ema+global-clipnorm", "embedding+gru"])
def test_trace_steps_multi_worker_trains_as_one_process(name, write_spec, tmp_path):
    # Two workers with two replicas each: global_clipnorm acts on the gradient summed over all four, as one
    # process's on the whole batch's; an Embedding's sparse gradient is summed sparse, as Keras does.
    path = write_spec(run_spec(name, distribute="multi_worker", distribute_timeout_s=60))
    done = two_workers(["-m", "nanscope", "trace-steps", str(path), "--json", "w{task}.json", "--trace",
                        "w{task}.jsonl"], tmp_path, replicas=2)
    for code, _, err in done:
        assert code == 0, err[-3000:]
    doc = json.loads((tmp_path / "w0.json").read_text())
    assert doc["run"]["distribute"] == {"strategy": "MultiWorkerMirroredStrategy", "replicas": 4, "workers": 2,
                                        "replicas_per_worker": 2}
    assert "MultiWorkerMirroredStrategy, 2 workers x 2 replicas" in done[0][1]
    assert all(step["replica_nonfinite"] == [0, 0, 0, 0] for step in doc["steps"])
    assert_report_right(name, doc, done[0][1])
    np.testing.assert_allclose([s["loss"] for s in doc["steps"]], plain_steps(CELLS[name]), rtol=1e-4)
