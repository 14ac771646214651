"""The package's boundaries, checked over its source: what one module may take from another.

import-linter (pyproject's [tool.importlinter], run by .ci/run) keeps the layers and the
absence of import cycles; these tests read the AST for what it does not see: a private
name (`_x`) imported from another module, and any touch of Keras', TensorFlow's or Typer's
private surface outside `nanscope/internals/`.
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
    """`_x`, not `__x__`."""
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


def test_the_private_import_check_sees_one():
    planted = ast.parse("from nanscope.run.verify import ranked_by_verification, _moments\n"
                        "from nanscope.rules import (\n    evidence,\n    _registry,\n)\n")
    assert private_imports("nanscope.keras.bundle_verify", PACKAGE / "keras" / "bundle_verify.py", planted) == [
        "nanscope/keras/bundle_verify.py:1 _moments", "nanscope/keras/bundle_verify.py:2 _registry"]


# Modules whose every import is private surface: TensorFlow's below its public `tensorflow` namespace
# (`tensorflow.python`, `tensorflow.compiler`, ...), Keras' implementation (`keras.src`), and any module
# path with a private part (`typer._click`).
PRIVATE_MODULES = ("tensorflow.", "keras.src")
# Underscored names that are public API: CPython's documented `os._exit` and `sys._getframe`, and the
# namedtuple methods (`_replace`, `_asdict`, ...).
PUBLIC_UNDERSCORED = {("os", "_exit"), ("sys", "_getframe")}
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# The model's train step, which the NanScope callback replaces for the length of a fit
# (internals.keras: replace_train_step, rebuild_train_function, set_train_function).
TRAIN_STEP_SURGERY = {"train_step", "train_function", "make_train_function"}
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr", "override"}


def defined_here(tree):
    """The private names a module defines: its functions, classes and globals, and the attributes it sets on
    `self` / `cls` (so `other._x` on an instance of its own class is its own business)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if is_private(name)}


def _own(receiver):
    return (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")) or (
        isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super")


def _private_module(module):
    return module.startswith(PRIVATE_MODULES) or any(is_private(part) for part in module.split("."))


def _import_touch(node):
    """The private module an import names, or None."""
    if isinstance(node, ast.Import):
        private = [a.name for a in node.names if _private_module(a.name) and a.name.split(".")[0] != "nanscope"]
        return f"import {', '.join(private)}" if private else None
    if node.level or node.module.split(".")[0] == "nanscope":
        return None
    names = [alias.name for alias in node.names]
    if _private_module(node.module) or any(_private_module(f"{node.module}.{name}") for name in names) or (
            node.module in ("tensorflow", "keras") and set(names) & {"python", "compiler", "core", "src"}):
        return f"from {node.module} import {', '.join(names)}"
    return None


def _attribute_touch(node, own):
    """True for `x._y` on another module's object, or a store into / rebuild of a model's train step."""
    if _own(node.value):
        return False
    if is_private(node.attr):
        return node.attr not in own | NAMEDTUPLE and (ast.unparse(node.value), node.attr) not in PUBLIC_UNDERSCORED
    return node.attr in TRAIN_STEP_SURGERY and (isinstance(node.ctx, ast.Store) or node.attr == "make_train_function")


def _call_touch(node, own):
    """True for getattr/setattr/hasattr/delattr/override naming such an attribute as a string."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS and len(node.args) > 1):
        return False
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or _own(node.args[0]):
        return False
    return (is_private(name.value) and name.value not in own) or name.value in TRAIN_STEP_SURGERY


def private_surface(path, tree):
    """'file:line what' of each touch of another library's private surface in one module (see the module doc)."""
    where = path.relative_to(PACKAGE.parent) if path.is_absolute() else path
    own, found = defined_here(tree), []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            what = _import_touch(node)
        elif (isinstance(node, ast.Attribute) and _attribute_touch(node, own)) or (
                isinstance(node, ast.Call) and _call_touch(node, own)):
            what = ast.unparse(node)
        if what is not None:
            found.append((node.lineno, f"{where}:{node.lineno} {what}"))
    return [text for _, text in sorted(found)]


def test_only_internals_touches_the_private_surface_of_keras_tensorflow_and_typer():
    internals = PACKAGE / "internals"
    found = [hit for _, path, tree in modules() if internals not in path.parents
             for hit in private_surface(path, tree)]
    assert found == []


PLANTED = """\
import os
import sys
import tensorflow.python.eager.context
from keras.src import backend
from typer._click.exceptions import UsageError
from tensorflow import python


class Step:
    def __init__(self):
        self._calls = 0

    def merged(self, other):
        other._calls += self._calls          # an instance of this module's own class: allowed
        return super()._merge(other)         # allowed


def hooks(model, optimizer, record):
    loss = model._compile_loss
    counter = getattr(optimizer, "_iterations", None)
    model.train_function = lambda iterator: None
    model.make_train_function(force=True)
    override(model, "train_step", None)
    os._exit(0)                              # allowed: documented
    sys._getframe(1)                         # allowed: documented
    return record._replace(loss=loss)        # allowed: namedtuple API
"""


def test_the_private_surface_check_sees_each_kind_of_touch():
    found = private_surface(Path("nanscope/planted.py"), ast.parse(PLANTED))
    assert found == [
        "nanscope/planted.py:3 import tensorflow.python.eager.context",
        "nanscope/planted.py:4 from keras.src import backend",
        "nanscope/planted.py:5 from typer._click.exceptions import UsageError",
        "nanscope/planted.py:6 from tensorflow import python",
        "nanscope/planted.py:19 model._compile_loss",
        "nanscope/planted.py:20 getattr(optimizer, '_iterations', None)",
        "nanscope/planted.py:21 model.train_function",
        "nanscope/planted.py:22 model.make_train_function",
        "nanscope/planted.py:23 override(model, 'train_step', None)",
    ]


README = PACKAGE.parent / "README.md"


def readme_map_entries():
    """The names README's module map gives at the top of `nanscope/` (its first column, two spaces in)."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index("```\nnanscope/") :].split("```")[1]
    names = set()
    for line in block.splitlines()[2:]:
        if not line.startswith("  ") or line.startswith("   "):
            if line and not line.startswith(" "):
                break  # configs/, tests/: the map of the package has ended
            continue
        first = line.strip().split("   ")[0]
        names.update(n.strip().rstrip("/") for n in first.split(","))
    return names


def test_the_top_of_the_package_holds_at_most_ten_modules_and_the_readme_map_names_each_entry():
    modules_at_top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    packages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert len(modules_at_top) <= 10, modules_at_top
    # Every folder of the package is a package (a folder without __init__.py hides from import-linter).
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == packages
    shown = {n.removesuffix(".py") for n in readme_map_entries()}
    assert shown == (set(modules_at_top) | set(packages)) - {"__init__", "__main__"}
