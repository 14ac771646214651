"""Rich rendering of recommendations: each finding with its evidence, its verification rows and its fix snippet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from nanscope.render.format import compact_table, fitted, fmt, hanging, header

# What the renderer draws is defined above it (rules.catalogue, report.model), and the layers contract keeps render
# from importing upwards, for type checking too: to mypy these are Any.
Recommendation: TypeAlias = Any
Report: TypeAlias = Any

# A name cell's wrapping: `fitted` hands each table builder one.
Wrap = Callable[[str], str]

SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
# A Panel's border and padding take 4 columns; a verification table sits 3 in under its recommendation.
PANEL_BORDER = 4
VERIFY_INDENT = 3


def _verification(rec: Recommendation, console: Console, width: int) -> Padding:
    if any(row.get("one_step") for row in rec.verification):
        return _step_verification(rec, console, width)

    def build(wrap: Wrap) -> Table:
        table = compact_table()
        table.add_column("fix", no_wrap=True)
        table.add_column("result", min_width=6)
        for column in ("steps", "final loss", "baseline"):
            table.add_column(header(column), justify="right", no_wrap=True)
        for row in rec.verification:
            result = row.get("verdict") or ("yes" if row["finite"] else f"no (step {row['first_nonfinite_step']})")
            if row.get("stalled") and row["finite"]:
                result = f"{row['skipped_updates']} update(s) skipped: it did not train"
            fix = row["fix"] + (" (together)" if row.get("together_with") else "")
            steps = str(row.get("horizon", row["steps_run"])) + ("*" if row.get("horizon_capped") else "")
            table.add_row(wrap(fix), result, steps, fmt(row.get("judged_loss", row["final_loss"])),
                          fmt(row.get("baseline")), style="green" if row["helped"] else "red")
        return table

    names = [row["fix"] + (" (together)" if row.get("together_with") else "") for row in rec.verification]
    parts: list[RenderableType] = [fitted(build, names, console, width - VERIFY_INDENT)]
    parts.extend(Text(f"* {row['fix']}: capped at {row['horizon']} of the {row['horizon_wanted']} steps its horizon "
                      "wants", style="dim") for row in rec.verification if row.get("horizon_capped"))
    return Padding(Group(*parts), (0, 0, 0, VERIFY_INDENT))


def _step_verification(rec: Recommendation, console: Console, width: int) -> Padding:
    """The rows of `replay --verify`: one saved step per fix, where it went non-finite, the losses before and after."""
    def build(wrap: Wrap) -> Table:
        table = compact_table()
        table.add_column("fix", no_wrap=True)
        table.add_column("step finite", min_width=6)
        for column in ("loss", "loss after the step"):
            table.add_column(header(column), justify="right", no_wrap=True)
        for row in rec.verification:
            where = " ".join(part for part in (row.get("nonfinite_phase"), row.get("nonfinite_op")) if part)
            finite = "yes" if row["finite"] else f"no ({where})" if where else "no"
            table.add_row(wrap(row["fix"]), finite, fmt(row["loss"]), fmt(row["final_loss"]),
                          style="green" if row["helped"] else "red")
        return table

    names = [row["fix"] for row in rec.verification]
    return Padding(fitted(build, names, console, width - VERIFY_INDENT), (0, 0, 0, VERIFY_INDENT))


def recommendations_panel(report: Report, console: Console) -> Panel:
    """The recommendations panel: each finding with its evidence, its verification rows and its fix."""
    if not report.recommendations:
        return Panel(Text("no findings", style="green"), title="recommendations", title_align="left")
    parts: list[RenderableType] = []
    for number, rec in enumerate(report.recommendations, start=1):
        verified = {True: "  [verified: it trains]", False: "  [verified: no fix trains]"}.get(rec.verified, "")
        if rec.verified and any(row.get("one_step") for row in rec.verification):
            verified = "  [the saved step stays finite; one step cannot show that it trains]"
        if rec.verified and rec.data.get("verified_with"):
            verified = f"  [verified together with {', '.join(rec.data['verified_with'])}: they train]"
        parts.append(hanging(f"{number}. ", Text.assemble((f"[{rec.severity}] ", SEVERITY_STYLE.get(rec.severity, "")),
                                                          (rec.title, "bold"), f"  ({rec.id})",
                                                          (verified, "green" if rec.verified else "red"))))
        parts.extend(hanging("   - ", line) for line in rec.evidence)
        if rec.verification:
            parts.append(_verification(rec, console, console.width - PANEL_BORDER))
        parts.append(Syntax(rec.fix, "yaml" if rec.fix.lstrip().startswith(("train:", "data:", "model:")) else "python",
                            theme="ansi_dark", background_color="default", padding=(0, 3), word_wrap=True))
    return Panel(Group(*parts), title="recommendations", title_align="left")
