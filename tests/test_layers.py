"""The package's boundaries, checked over its source: what one module may take from another.

import-linter (pyproject's [tool.importlinter], run by .ci/run) keeps the layers and the
absence of import cycles; these tests read the AST for what it does not see: a private
name (`_x`) imported from another module.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nanscope"


def modules():
    """(dotted name, parsed tree) of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(name, path, tree):
    """'file:line name' of each private name this module imports from another nanscope module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # a relative import: resolve it against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, source] if source else base)
            if source.split(".")[0] != "nanscope":
                continue
            private = [a.name for a in node.names if is_private(a.name)]
            private += [part for part in source.split(".") if is_private(part)]
        elif isinstance(node, ast.Import):
            private = [part for a in node.names if a.name.split(".")[0] == "nanscope"
                       for part in a.name.split(".") if is_private(part)]
        else:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {p}" for p in private]
    return found


def test_no_module_imports_a_private_name_of_another():
    found = [hit for name, path, tree in modules() for hit in private_imports(name, path, tree)]
    assert found == []


def test_the_private_import_check_sees_one(tmp_path):
    planted = ast.parse("from nanscope.verify import ranked_by_verification, _moments\n"
                        "from nanscope.rules import (\n    evidence,\n    _registry,\n)\n")
    assert private_imports("nanscope.keras.bundle_verify", PACKAGE / "keras" / "bundle_verify.py", planted) == [
        "nanscope/keras/bundle_verify.py:1 _moments", "nanscope/keras/bundle_verify.py:2 _registry"]
