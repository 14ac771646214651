"""The mutation figure per module, from mutmut's results in mutants/ (docs/mutation.md).

Run from the repository root after `mutmut run`: `python tests/mutation_figure.py`. Killed over tested
(killed + survived; a timeout counts as killed), with the mutants no selected test reaches, those not run
yet, and the fix implementations left out of the figure (docs/mutation.md says why) beside it.
"""

import collections
import json
import re
from pathlib import Path

KILLED, SURVIVED, NO_TESTS = {1, 3, 24, 36, 152, 255, -24}, {0}, {5, 33}
# The fix implementations: they change a live session or a bundle for --verify, and retraining decides them.
LEFT_OUT = re.compile(
    r"\.x_(verify_fixes|bundle_fixes|bundle_fixers|relu6_model|_has_relu|standardized_inputs|standardized_targets|"
    r"_standardised|moments|optimizer_setting|repaired|_relabelled|_optimizer_arguments|_schedule|"
    r"_float16_without_loss_scaling|fixtures|unit_of|evidence_from_session|verify_recommendations|_baseline|_row|"
    r"_verify_combinations|changes_for|combined)__mutmut_|\.xǁ_Judgingǁ")


def tally(root=Path("mutants")):
    """{module: Counter of killed, survived, not reached, not run, left out}."""
    rows = collections.defaultdict(collections.Counter)
    for path in root.glob("**/*.py.meta"):
        for key, code in json.loads(path.read_text())["exit_code_by_key"].items():
            module = re.split(r"\.x_|\.xǁ", key)[0].removeprefix("nanscope.")
            if LEFT_OUT.search(key):
                status = "left out"
            elif code in KILLED:
                status = "killed"
            elif code in SURVIVED:
                status = "survived"
            elif code in NO_TESTS:
                status = "not reached"
            else:
                status = "not run"
            rows[module][status] += 1
    return rows


def main():
    rows, total = tally(), collections.Counter()
    print("| module | killed | survived | not reached | not run | left out | killed / tested |")
    print("|---|---|---|---|---|---|---|")
    for module in sorted(rows):
        counts = rows[module]
        total.update(counts)
        tested = counts["killed"] + counts["survived"]
        share = f"{100 * counts['killed'] / tested:.1f}%" if tested else "-"
        print(f"| {module} | {counts['killed']} | {counts['survived']} | {counts['not reached']} | "
              f"{counts['not run']} | {counts['left out']} | {share} |")
    tested = total["killed"] + total["survived"]
    print(f"| **all** | **{total['killed']}** | **{total['survived']}** | {total['not reached']} | "
          f"{total['not run']} | {total['left out']} | **{100 * total['killed'] / max(tested, 1):.1f}%** |")
    reached = tested + total["not reached"]
    print(f"\nkilled / (tested + not reached): {100 * total['killed'] / max(reached, 1):.1f}%")


if __name__ == "__main__":
    main()
