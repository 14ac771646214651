"""Interruption, faults and untrusted files: nothing crashes, nothing is lost.

Signals go to real `python -m nanscope` processes; faults inside a step come from
purpose-built layers (a failing `tf.debugging.assert_*`, a `tf.py_function` that XLA
cannot compile or that raises MemoryError).
"""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import pytest
import yaml
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.jsonio import write_json, write_text_atomic
from nanscope.store.tracefile import read_trace

CONFIGS = Path(__file__).parent.parent / "configs"
FACTORIES = Path(__file__).parent / "bad_inputs" / "factories.py"
SIGNAL_POINTS = Path(__file__).parent / "specs" / "signal_points.py"
runner = CliRunner()


def tiny_spec(tmp_path, model="dense", model_args=None, steps=6, **train):
    spec = {
        "model": {"factory": f"{FACTORIES}:{model}", "args": model_args or {}},
        "data": {"factory": f"{FACTORIES}:arrays", "batch_size": 8, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": steps, **train},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def long_run_spec(tmp_path):
    """The clipped example (it stays finite) with a step limit no test reaches."""
    spec = tmp_path / "long.yaml"
    spec.write_text((CONFIGS / "exploding-regression-clipnorm.yaml").read_text()
                    .replace("models.py", str(CONFIGS / "models.py")).replace("steps: 1600", "steps: 100000"))
    return spec


def start_and_wait(argv, trace, lines=20):
    """Start `python -m nanscope ARGV`; return it once the trace holds `lines` complete lines."""
    process = subprocess.Popen([sys.executable, "-m", "nanscope", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and (not trace.exists() or trace.read_text().count("\n") < lines):
        if process.poll() is not None:
            break
        time.sleep(0.1)
    assert process.poll() is None, process.communicate()
    return process


def start_and_wait_for_marker(argv, marker, cwd):
    """Start `python -m nanscope ARGV`; return it once a factory of its spec has written `marker`."""
    process = subprocess.Popen([sys.executable, "-m", "nanscope", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=cwd)
    deadline = time.time() + 90
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists() and process.poll() is None, process.communicate()
    return process


def signal_point_spec(tmp_path, data, model="dense", model_args=None, steps=40):
    """A tiny spec whose data or model factory (tests/specs/signal_points.py) marks where the run is."""
    spec = {
        "model": {"factory": f"{SIGNAL_POINTS}:{model}" if model != "dense" else f"{FACTORIES}:dense",
                  "args": model_args or {}},
        "data": {"factory": f"{SIGNAL_POINTS}:{data}", "args": {"marker": str(tmp_path / "loading")}
                 if data == "blocking_arrays" else {}, "batch_size": 8, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": steps},
    }
    path = tmp_path / "signal.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# --- signals -------------------------------------------------------------------------------------------


def test_sigterm_finishes_the_report_and_exits_130(tmp_path):
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.json"
    process = start_and_wait(["trace-steps", str(long_run_spec(tmp_path)), "--trace", str(trace), "--json", str(out)],
                             trace)
    process.send_signal(signal.SIGTERM)
    _stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    document = json.loads(out.read_text())
    assert document["interrupted"] is True and document["steps_run"] >= 19
    _header, steps, others = read_trace(trace)
    # Every step the report counts is in the trace (a signal between the two writes may leave the trace one ahead).
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) - document["steps_run"] in (0, 1)
    assert others[-1]["kind"] == "summary" and others[-1]["interrupted"] is True


def test_kill_9_keeps_every_completed_step_and_report_redraws_without_tensorflow(tmp_path):
    trace = tmp_path / "t.jsonl"
    process = start_and_wait(["trace-steps", str(long_run_spec(tmp_path)), "--trace", str(trace)], trace, lines=30)
    seen = trace.read_text().count('"kind": "step"')  # full step lines on disk just before the kill
    process.kill()
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    _header, steps, others = read_trace(trace)
    assert len(steps) >= seen - 1 and [s["step"] for s in steps] == list(range(len(steps)))
    assert others == []  # killed: no summary

    with open(trace, "a", encoding="utf-8") as handle:  # a write torn by the kill
        handle.write('{"kind": "step", "step": ' + str(len(steps)) + ', "loss": 1.')
    assert len(read_trace(trace)[1]) == len(steps)

    out = tmp_path / "redrawn.json"
    code = ("import sys; from typer.testing import CliRunner; from nanscope.cli import app; "
            f"r = CliRunner().invoke(app, ['report', {str(trace)!r}, '--json', {str(out)!r}]); "
            "print(r.exit_code, 'tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["130", "False"], result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert document["steps_run"] == len(steps) and document["interrupted"] is True
    assert any("summary" in note for note in document["notes"])


def test_sigint_during_compare_clipping_exits_130_and_reports_what_finished(tmp_path):
    """The signal lands in step 10 of the second strategy: the first one is reported, the second is not."""
    out, marker, release = tmp_path / "r.json", tmp_path / "at-step", tmp_path / "release"
    steps = 40
    # Training calls: `none` makes 40; clipnorm's optimizer check makes 1, then its steps: call 51 is its 10th step.
    spec = signal_point_spec(tmp_path, "arrays", model="gated_model", steps=steps,
                             model_args={"marker": str(marker), "release": str(release), "at": steps + 11})
    process = start_and_wait_for_marker(["compare-clipping", str(spec), "--strategies", "none,clipnorm=1",
                                         "--json", str(out)], marker, tmp_path)
    process.send_signal(signal.SIGINT)
    release.write_text("go\n")
    _stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    document = json.loads(out.read_text())
    assert document["interrupted"] is True
    assert [(s["name"], s["steps_run"]) for s in document["strategies"]] == [("none", steps)]
    assert "interrupted: 1 of 2 strategies finished; the verdict covers those" in document["notes"]


@pytest.mark.parametrize("command", ["compare-clipping", "trace-steps"])
def test_sigint_during_start_up_still_writes_the_json(tmp_path, command):
    """A signal while the data loads (after the output paths were checked) still gives a report: no steps."""
    out = tmp_path / "r.json"
    spec = signal_point_spec(tmp_path, "blocking_arrays")
    process = start_and_wait_for_marker([command, str(spec), "--json", str(out)], tmp_path / "loading", tmp_path)
    process.send_signal(signal.SIGINT)
    _stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    document = json.loads(out.read_text())
    assert document["interrupted"] is True and document["run"]["spec"] == str(spec)
    assert any(note.startswith("interrupted during start-up") for note in document["notes"])
    if command == "compare-clipping":
        assert document["strategies"] == [] and document["recommended"] is None
    else:
        assert document["steps_run"] == 0 and document["steps"] == []


# --- atomic output files -------------------------------------------------------------------------------


def test_a_write_that_fails_midway_leaves_the_old_report(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    write_json(target, {"status": "old"})
    old = target.read_text()

    with pytest.raises(UnicodeEncodeError):  # text that cannot be encoded, half-way through
        write_text_atomic(target, '{"status": "new", "x": "' + "a" * 100_000 + "\ud800" + '"}')
    assert target.read_text() == old

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the data is written, the disk fills before it is safe
    with pytest.raises(OSError):
        write_json(target, {"status": "new", "steps": list(range(10_000))})
    assert target.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"], "a temporary file was left behind"


def test_bad_input_leaves_an_existing_report_untouched(tmp_path):
    out = tmp_path / "r.json"
    out.write_text('{"status": "healthy"}\n')
    bad = tiny_spec(tmp_path, steps=0)
    result = runner.invoke(app, ["trace-steps", str(bad), "--json", str(out), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2
    assert out.read_text() == '{"status": "healthy"}\n'


# --- faults inside a step ------------------------------------------------------------------------------


def test_failed_op_inside_a_step_is_a_clear_error_and_keeps_the_steps_done(tmp_path):
    spec, trace = tiny_spec(tmp_path, model="op_error", model_args={"limit": 3}, steps=10), tmp_path / "t.jsonl"
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(trace)])
    assert result.exit_code == 2, (result.output, result.exception)
    line = one_line(result.stderr)
    for text in ("tiny.yaml", "step 3", "InvalidArgumentError", "FailsAfter: step limit passed", str(trace)):
        assert text in line, line
    _header, steps, others = read_trace(trace)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert others[-1]["kind"] == "error" and others[-1]["step"] == 3
    redrawn = runner.invoke(app, ["report", str(trace)])
    assert redrawn.exit_code == 130 and "Traceback" not in redrawn.output


def test_xla_compilation_error_is_a_clear_error(tmp_path):
    spec = tiny_spec(tmp_path, model="python_in_step", jit_compile=True)
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2, (result.output, result.exception)
    line = one_line(result.stderr)
    assert "tiny.yaml" in line and "step 0" in line and "XLA" in line and "jit_compile: false" in line, line


def test_out_of_memory_inside_a_step_is_a_clear_error(tmp_path):
    spec = tiny_spec(tmp_path, model="python_in_step", model_args={"error": "memory"})
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2, (result.output, result.exception)
    line = one_line(result.stderr)
    assert "out of memory" in line and "ResourceExhaustedError" in line and "--batch-size" in line, line


def test_the_same_python_layer_runs_without_xla(tmp_path):
    spec = tiny_spec(tmp_path, model="python_in_step", steps=3)
    result = runner.invoke(app, ["trace-steps", str(spec), "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0, (result.output, result.exception)


# --- untrusted files -----------------------------------------------------------------------------------


def test_keras_file_needing_unsafe_deserialization_is_refused_without_unsafe(tmp_path):
    sys.path.insert(0, str(FACTORIES.parent))
    try:
        import factories
    finally:
        sys.path.remove(str(FACTORIES.parent))
    factories.with_lambda().save(tmp_path / "lambda.keras")
    spec = {"model": {"path": "lambda.keras"},
            "data": {"factory": f"{FACTORIES}:arrays", "batch_size": 8},
            "train": {"loss": "mse", "optimizer": "sgd", "steps": 2}}
    path = tmp_path / "lambda.yaml"
    path.write_text(yaml.safe_dump(spec))
    argv = ["trace-steps", str(path), "--trace", str(tmp_path / "t.jsonl")]

    refused = runner.invoke(app, argv)
    assert refused.exit_code == 2
    line = one_line(refused.stderr)
    assert "lambda.yaml" in line and "model.path" in line and "--unsafe" in line, line
    assert not (tmp_path / "t.jsonl").exists()

    allowed = runner.invoke(app, [*argv, "--unsafe"])
    assert allowed.exit_code == 0, (allowed.output, allowed.exception)


def test_help_says_factories_run_user_code_and_unsafe_is_explicit():
    def text(argv):  # the help as words, without Rich's box drawing and line wrapping
        return " ".join(runner.invoke(app, argv).output.replace("│", " ").split())

    assert "Python code that nanscope imports and runs" in text(["--help"])
    trace_help = text(["trace-steps", "--help"])
    assert "--unsafe" in trace_help and "trust" in trace_help
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert "Only point nanscope at code you trust" in readme and "safe loader" in readme


def test_a_run_makes_no_network_access(tmp_path, monkeypatch):
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    result = runner.invoke(app, ["trace-steps", str(tiny_spec(tmp_path, steps=3)), "--trace", str(tmp_path / "t.jsonl"),
                                 "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert attempts == []
