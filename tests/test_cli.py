"""The real CLI: exit codes, one-line errors, JSON to stdout, help without TensorFlow."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanscope.cli import app

CONFIGS = Path(__file__).parent.parent / "configs"
SPECS = Path(__file__).parent / "specs"
runner = CliRunner()


def test_help_does_not_import_tensorflow():
    code = ("import sys; from typer.testing import CliRunner; from nanscope.cli import app; "
            "r = CliRunner().invoke(app, ['--help']); r2 = CliRunner().invoke(app, ['trace-steps', '--help']); "
            "assert r.exit_code == 0 and r2.exit_code == 0; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_nonfinite_run_exits_1_and_writes_json(tmp_path):
    result = runner.invoke(app, ["trace-steps", str(CONFIGS / "exploding-regression.yaml"), "--json", "-",
                                 "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 1
    start = result.stdout.index('{\n  "schema"')
    document = json.loads(result.stdout[start:])
    # README: the run goes non-finite at step 8 of the first epoch, in the loss phase.
    first = document["first_nonfinite"]
    assert document["status"] == "nonfinite" and (first["step"], first["phase"]) == (8, "loss")


def test_healthy_run_exits_0_and_overrides_apply(tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["trace-steps", str(CONFIGS / "healthy-classification.yaml"), "--steps", "7",
                                 "--lr", "0.002", "--batch-size", "16", "--seed", "5", "--json", str(out),
                                 "--trace", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["steps_run"] == 7 and document["run"]["batch_size"] == 16 and document["run"]["seed"] == 5
    assert document["run"]["optimizer_config"]["learning_rate"] == pytest.approx(0.002)


def test_report_redraws_from_the_trace(tmp_path):
    trace, original = tmp_path / "t.jsonl", tmp_path / "r.json"
    first = runner.invoke(app, ["trace-steps", str(CONFIGS / "exploding-regression.yaml"), "--trace", str(trace),
                                "--json", str(original)])
    assert first.exit_code == 1, first.output
    redrawn_out = tmp_path / "redrawn.json"
    result = runner.invoke(app, ["report", str(trace), "--json", str(redrawn_out)])
    assert result.exit_code == 1
    assert "first non-finite" in result.output
    expected, redrawn = json.loads(original.read_text()), json.loads(redrawn_out.read_text())
    # The redrawn report is the original one, except where it says which trace it was redrawn from.
    assert redrawn.pop("trace") == str(trace) and expected.pop("trace") == str(trace)
    assert redrawn == expected


def test_a_stop_request_from_an_earlier_command_does_not_stop_the_next_one(tmp_path):
    from nanscope import interrupt

    # A Ctrl-C that ended an earlier command in this process (a notebook, this test process) is remembered...
    with pytest.raises(KeyboardInterrupt):
        interrupt.request()
    assert interrupt.requested()
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["trace-steps", str(CONFIGS / "healthy-classification.yaml"), "--steps", "5",
                                 "--json", str(out), "--trace", str(tmp_path / "t.jsonl")])
    # ...but the next command starts afresh and runs all 5 steps instead of stopping at step 0 with exit 130.
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["steps_run"] == 5 and not interrupt.requested()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {factory: x.py:build}\ndata: {synthetic: {kind: regression}, batchsize: 3}\n")
    result = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and "batch_size" in lines[0]
    assert "Traceback" not in result.stderr


def test_debug_variable_shows_the_traceback(tmp_path):
    missing = tmp_path / "nope.yaml"
    env = {**os.environ, "NANSCOPE_DEBUG": "1"}
    result = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps", str(missing)], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_sigint_finishes_the_report_and_exits_130(tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text((CONFIGS / "exploding-regression-clipnorm.yaml").read_text()
                    .replace("models.py", str(CONFIGS / "models.py")).replace("steps: 1600", "steps: 100000"))
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.json"
    process = subprocess.Popen([sys.executable, "-m", "nanscope", "trace-steps", str(spec), "--trace", str(trace),
                                "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The wait ends as soon as 20 steps are traced; its bound only matters on a loaded machine, where TensorFlow's
    # start-up alone took over 60 s (the signal then came before the first step: steps_run 0).
    deadline = time.time() + 300
    while time.time() < deadline and (not trace.exists() or trace.read_text().count("\n") < 20):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    document = json.loads(out.read_text())
    assert document["interrupted"] is True and document["steps_run"] >= 19
    assert "interrupted" in stdout


def test_bad_option_value_is_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps",
                             str(CONFIGS / "exploding-regression.yaml"),
                             "--steps", "abc"], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--steps" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["check-data", "trace-steps"])
def test_a_factory_that_imports_keras_itself_prints_no_tensorflow_start_up_lines(tmp_path, command):
    (tmp_path / "data.py").write_text(
        "import keras\nimport numpy as np\n\n"
        "def load():\n"
        "    rng = np.random.default_rng(0)\n"
        "    return rng.standard_normal((32, 3)).astype('float32'), rng.standard_normal((32, 1)).astype('float32')\n"
        "\n\ndef build():\n"
        "    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {factory: data.py:build}\ndata: {factory: data.py:load, batch_size: 8}\n"
                    "train: {loss: mse, optimizer: {name: sgd, learning_rate: 0.01}, steps: 3}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "NANSCOPE_DEBUG")}
    extra = ["--trace", str(tmp_path / "t.jsonl")] if command == "trace-steps" else []
    result = subprocess.run([sys.executable, "-m", "nanscope", command, str(spec), *extra], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_a_run_on_all_nan_columns_prints_nothing_on_stderr(tmp_path):
    (tmp_path / "data.py").write_text(
        "import numpy as np\n\n"
        "def load():\n"
        "    x = np.ones((32, 3), 'float32')\n"
        "    x[:, 1] = np.nan\n"
        "    return x, np.ones((32, 1), 'float32')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{factory: {SPECS / 'phase_models.py'}:dense, args: {{features: 3}}}}\n"
                    "data: {factory: data.py:load, batch_size: 8}\n"
                    "train: {loss: mse, optimizer: {name: sgd, learning_rate: 0.01}, steps: 3}\n")
    result = subprocess.run([sys.executable, "-m", "nanscope", "trace-steps", str(spec), "--verify",
                             "--trace", str(tmp_path / "t.jsonl")], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == ""


def test_an_output_that_fails_late_is_one_line_and_exit_2(tmp_path, monkeypatch):
    import nanscope.jsonio

    def full_disk(target, value):
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(nanscope.jsonio, "write_json", full_disk)
    monkeypatch.delenv("NANSCOPE_DEBUG", raising=False)
    result = runner.invoke(app, ["trace-steps", str(CONFIGS / "exploding-regression.yaml"), "--steps", "2",
                                 "--trace", str(tmp_path / "t.jsonl"), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"nanscope: error: {tmp_path / 'r.json'}: No space left on device"


@pytest.mark.parametrize("command", ["", "trace-steps", "replay", "check-data", "compare-clipping", "report"])
def test_help_shows_flags_as_flags_and_keeps_square_brackets(command):
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.output  # a flag takes no value
    if command in ("trace-steps", "compare-clipping"):
        assert "needs nanscope[plot]" in result.output  # not eaten as Rich markup
    for option in ("--keep-going", "--verify", "--unsafe", "--strict"):
        if command == "trace-steps":
            assert option in result.output


def test_reports_traces_and_plots_share_one_file_mode_that_honours_the_umask(tmp_path):
    pytest.importorskip("matplotlib")
    old = os.umask(0o027)
    try:
        out = {name: tmp_path / name for name in ("r.json", "t.jsonl", "p.png")}
        result = runner.invoke(app,
                               ["trace-steps", str(CONFIGS / "exploding-regression.yaml"), "--json", str(out["r.json"]),
                                     "--trace", str(out["t.jsonl"]), "--plot", str(out["p.png"])])
    finally:
        os.umask(old)
    assert result.exit_code == 1, result.output
    modes = {name: path.stat().st_mode & 0o777 for name, path in out.items()}
    assert modes == {name: 0o640 for name in out}, modes
