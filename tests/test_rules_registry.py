"""The rule registry is the one list of rules: the catalogue, docs/rules/, the README table, the fix appliers
and the realistic corpus's fixtures all agree with it."""

import importlib.util
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.rules import registry
from nanscope.rules.catalogue import RULES
from nanscope.rules.rule import Fixtures

REPO = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("realistic_cases", REPO / "tests" / "realistic" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
_spec = importlib.util.spec_from_file_location("realistic_data_files", cases.DATA_FILES)
data_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(data_files)
# Rules that check-data fires from its scan, not trace-steps from a run (checkdata/findings.py).
CHECK_DATA_ONLY = {"fix-labels", "drop-constant-features"}


def test_the_catalogue_is_the_registry_in_order_with_unique_ids():
    ids = [rule.id for rule in registry.rules()]
    assert len(ids) == len(set(ids)) == 24
    assert list(RULES) == ids
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule_id) for rule_id in ids)


def test_every_rule_module_declares_its_rules_and_fixtures():
    for unit in registry.UNITS:
        assert unit.RULES and all(rule.title and rule.detects and rule.fix for rule in unit.RULES), unit.__name__
        for rule in unit.RULES:
            assert isinstance(registry.fixtures(rule.id), Fixtures), rule.id
            assert registry.unit_of(rule.id) is unit


def test_every_rule_but_check_datas_has_a_detector():
    detected = {rule_id for rule_ids, _ in registry.detectors() + registry.fallbacks() for rule_id in rule_ids}
    assert detected == set(RULES) - CHECK_DATA_ONLY


def test_docs_rules_has_one_page_per_rule_and_no_other():
    pages = {path.stem for path in (REPO / "docs" / "rules").glob("*.md")}
    assert pages == set(RULES)


def test_each_docs_page_shows_the_rules_title_default_fix_and_whether_verify_applies_it():
    verifiable = set(registry.verify_fixers())
    for rule in RULES.values():
        page = (REPO / rule.docs).read_text()
        assert page.startswith(f"# `{rule.id}`: {rule.title}\n"), rule.id
        assert rule.fix in page, f"{rule.docs} does not show the default fix"
        applies = "`trace-steps --verify` applies this fix" in page or "`trace-steps --verify` replaces" in page
        assert applies == (rule.id in verifiable), rule.id
        assert ("cannot apply this fix" in page) == (rule.id not in verifiable | CHECK_DATA_ONLY), rule.id


def test_the_readme_table_lists_the_registry_in_order_with_its_pages():
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| \[`([a-z0-9-]+)`\]\((docs/rules/[a-z0-9-]+\.md)\) \|", readme, re.MULTILINE)
    assert [rule_id for rule_id, _ in rows] == list(RULES)
    assert all(page == RULES[rule_id].docs for rule_id, page in rows)


def test_every_fixture_names_a_corpus_case_of_the_right_kind():
    for rule_id in set(RULES) - CHECK_DATA_ONLY:
        fixtures = registry.fixtures(rule_id)
        for name in fixtures.fires:
            assert name in cases.BUGGY, (rule_id, name)
        for name in fixtures.quiet:
            assert name in cases.HEALTHY, (rule_id, name)
        # The case a rule names as its own must expect it (cases that fire several rules name the first).
        assert not fixtures.fires or any(cases.BUGGY[name][1] == rule_id for name in fixtures.fires), rule_id


def test_a_check_data_rules_fixtures_are_tables_of_the_check_data_corpus_it_fires_on_and_not_on_the_twin(tmp_path):
    for rule_id in CHECK_DATA_ONLY:
        fixtures = registry.fixtures(rule_id)
        assert fixtures.fires and fixtures.quiet, rule_id
        for name in fixtures.fires:
            args, expected, severity = cases.CHECK_DATA_BUGGY[name]
            assert expected == rule_id and _check_data(tmp_path / f"{name}.csv", args).get(rule_id) == severity
        for name in fixtures.quiet:
            assert rule_id not in _check_data(tmp_path / f"{name}.csv", cases.CHECK_DATA_HEALTHY[name]), name


def _check_data(path, args):
    """{rule id: severity} of `nanscope check-data` on the corpus table written with `args`."""
    data_files.churn_csv(path, **args)
    result = CliRunner().invoke(app, ["check-data", str(path), *cases.CHECK_DATA_ARGS, "--json", "-"])
    return {r["id"]: r["severity"] for r in json.loads(result.stdout)["recommendations"]}
