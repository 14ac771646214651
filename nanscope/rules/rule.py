"""What a rule is: its catalogue entry (`Rule`), the finding it makes (`Recommendation`), and its fixtures.

Each rule module (`nanscope/rules/<rule>.py`, listed in `rules/registry.py`) declares its
`Rule`s, the detector that reads the run's `facts`, the fixes `--verify` can apply, and the
names of its fixtures in the realistic corpus (`tests/realistic/cases.py`).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Rule:
    """One diagnosis nanscope can make.

    Args:
        id: str. Stable kebab-case id; users and tests depend on it.
        title: str. What to do, as an imperative ("Lower the learning rate").
        detects: str. One sentence: the evidence that triggers it.
        fix: str. The default fix, as a YAML or code snippet.
    """

    id: str
    title: str
    detects: str
    fix: str

    @property
    def docs(self) -> str:
        """The rule's page, relative to the repository root."""
        return f"docs/rules/{self.id}.md"

    def recommend(self, severity: str, evidence: Iterable[str], fix: str | None = None,
                  data: dict[str, Any] | None = None) -> "Recommendation":
        """A Recommendation of this rule with this run's evidence; `fix` defaults to the rule's."""
        if severity not in SEVERITIES:
            raise ValueError(f"`severity` must be one of {SEVERITIES}. Received: severity={severity!r}")
        return Recommendation(self.id, self.title, severity, list(evidence), fix or self.fix, None, dict(data or {}),
                              docs=self.docs)


@dataclass(frozen=True)
class Fixtures:
    """A rule's two fixtures in the realistic corpus (`tests/realistic/cases.py`), by case name.

    A check-data rule's fixtures are tables of the corpus's check-data part (`CHECK_DATA_BUGGY`, `CHECK_DATA_HEALTHY`),
    where it must fire at the severity the table gives.

    Args:
        fires: tuple of str. Buggy cases where the rule must rank in the top 2 at warning or error level.
        quiet: tuple of str. Healthy cases, as close to the buggy ones as can be, where it must not fire.
    """

    fires: tuple[str, ...]
    quiet: tuple[str, ...]


@dataclass
class Recommendation:
    """A rule that fired in this run, with the evidence it cites.

    Args:
        id: str. The rule id.
        title: str. The rule title.
        severity: str. "error", "warning" or "info".
        evidence: list of str. Measured facts, each one line ("step 12: grad norm 3.1e+05").
        fix: str. The concrete fix for this run (a YAML/code snippet with computed values).
        verified: bool or None. Whether a re-run with the fix applied stayed finite (None: not tried).
        data: dict. Machine-readable evidence (values the message cites).
        verification: list of dict. Per applied fix: stayed finite, final and best loss vs the unfixed run.
        docs: str. The rule's documentation page.
    """

    id: str
    title: str
    severity: str
    evidence: list[str]
    fix: str
    verified: bool | None = None
    data: dict[str, Any] = field(default_factory=dict)
    verification: list = field(default_factory=list)
    docs: str | None = None


# What a detector returns for each finding: (score, Recommendation), most direct evidence scoring highest.
Finding: TypeAlias = tuple[float, Recommendation]
