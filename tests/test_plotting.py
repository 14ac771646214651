"""--plot: a PNG of loss, gradient norm and the worst layers; a clear exit 2 without matplotlib."""

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanscope.cli import app

CONFIGS = Path(__file__).parent.parent / "configs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_trace_steps_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    image = tmp_path / "trace.png"
    result = CliRunner().invoke(app, ["trace-steps", str(CONFIGS / "exploding-regression.yaml"), "--plot", str(image),
                                      "--trace", str(tmp_path / "trace.jsonl")])
    assert result.exit_code == 1, result.output
    assert image.read_bytes()[:8] == PNG_MAGIC and image.stat().st_size > 20_000


def test_plot_loss_curves_draws_nonfinite_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from nanscope.report.plotting import plot_loss_curves

    image = tmp_path / "curves.png"
    plot_loss_curves({"none": [4.0, 40.0, 4e4, float("nan"), float("inf")], "clipnorm": [4.0, 3.0, 2.5, 2.0, 1.8]},
                     image, title="compare-clipping", onsets={"none": 3})
    assert image.read_bytes()[:8] == PNG_MAGIC and image.stat().st_size > 10_000


def test_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    result = CliRunner().invoke(app, ["trace-steps", str(CONFIGS / "exploding-regression.yaml"),
                                      "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "`--plot` needs matplotlib" in result.output and "nanscope[plot]" in result.output
    assert not (tmp_path / "x.png").exists()
