"""The user's code inside a repro bundle: copied at save, so a bundle replays from its folder alone.

A bundle records where each user file came from by a name a reader can find in their
own project (`origin`: the path relative to the folder the run started in, or the
file's name when it lay elsewhere) and where its copy is, relative to the bundle
(`code/<name>`). Replay imports the copies; the report names the origin, with the
line, since the copy is the same text.

Besides the files that define what the model needs, the Python files they import by a
plain module name from their own folder (`import helpers`, `from layers import Gain`)
are copied too, transitively, so those imports still resolve from `code/`. Packages and
relative imports are not followed: a module that needs them must be importable where
the bundle is replayed.
"""

import ast
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

CODE_DIR = "code"


class _Located(Protocol):
    """Where a first non-finite value was made, as far as naming its file needs (report.model.FirstNonfinite)."""

    source: str | None
    context: dict[str, Any]
    detail: list[Any]


def origin_name(path: str | os.PathLike[str]) -> str:
    """`path` as a reader finds it in their project: relative to the current folder when below it, else its name."""
    path = Path(path).resolve()
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def with_imports(files: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """`files` (resolved Paths) and, transitively, the sibling .py files they import by module name, in order."""
    found: list[Path] = []
    pending = [Path(f).resolve() for f in files]
    while pending:
        path = pending.pop(0)
        if path in found:
            continue
        found.append(path)
        pending.extend(sibling for sibling in _sibling_imports(path) if sibling not in found)
    return found


def _sibling_imports(path: Path) -> list[Path]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    siblings = (path.parent / f"{name}.py" for name in names if "." not in name)
    return [sibling.resolve() for sibling in siblings if sibling.is_file()]


def copy_code(files: Iterable[str | os.PathLike[str]], folder: str | os.PathLike[str]) -> dict[Path, str]:
    """Copy `files` (with their sibling imports) into `folder`/code; {resolved original: "code/<name>"}.

    Two files of the same name from different folders: the second keeps its name's stem with a number
    (`layers_2.py`), so its import by module name no longer resolves; the first one keeps it.
    """
    copies: dict[Path, str] = {}
    taken: set[str] = set()
    for path in with_imports(files):
        name, n = path.name, 1
        while name in taken:
            n += 1
            name = f"{path.stem}_{n}{path.suffix}"
        taken.add(name)
        (Path(folder) / CODE_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(folder) / CODE_DIR / name)
        copies[path] = f"{CODE_DIR}/{name}"
    return copies


def in_bundle(directory: str | os.PathLike[str], recorded: str | os.PathLike[str]) -> Path:
    """The path of a recorded file: `recorded` relative to the bundle folder (an absolute one, from a bundle written
    before code was copied, stays as it is)."""
    return Path(directory) / recorded


def shown_source(source: str, directory: str | os.PathLike[str], origins: Mapping[str, str]) -> str:
    """A `file:line` of the replay, with a file copied into the bundle named by its origin instead.

    Args:
        source: str or None. As the op watch gives it (absolute, or relative to the current folder).
        directory: the bundle folder.
        origins: {"code/<name>": origin}.
    """
    copy = copy_named(source, directory)
    if copy is None or copy not in origins:
        return source
    return f"{origins[copy]}:{source.rpartition(':')[2]}"


def copy_named(source: str | None, directory: str | os.PathLike[str]) -> str | None:
    """The bundle-relative path ("code/<name>") of the file a `file:line` names, or None outside the bundle."""
    if not source or ":" not in source:
        return None
    try:
        relative = Path(os.path.abspath(source.rpartition(":")[0])).relative_to(Path(os.path.abspath(directory)))
    except ValueError:
        return None
    return relative.as_posix()


def named_by_origin(value: Any, origins: Iterable[str]) -> Any:
    """`value` (a str, or lists and dicts of them) with each absolute `.../<origin>:<line>` written `<origin>:<line>`:
    the run's own report names the user's files by where they were on the machine that wrote the bundle."""
    if isinstance(value, str):
        for origin in origins:
            value = re.sub(r"(?<![\w.])/[^\s:'\"()]*/" + re.escape(origin) + r"(?=:\d)", origin, value)
        return value
    if isinstance(value, list):
        return [named_by_origin(v, origins) for v in value]
    if isinstance(value, dict):
        return {k: named_by_origin(v, origins) for k, v in value.items()}
    return value


def name_origins(first: _Located, directory: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Name the user's files in `first` (its source line, a tf.where's) as in their project, not as the bundle's
    copies the replay ran: the same text, so the same line numbers."""
    origins = {entry["file"]: entry["origin"] for entry in document.get("code_files") or []
               if isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("file", "origin"))}
    source = first.source
    copy = copy_named(source, directory)
    if source is None or copy is None or copy not in origins:
        return
    first.source = shown_source(source, directory, origins)
    where = first.context.get("discarded_by")
    if isinstance(where, dict) and where.get("source"):
        where["source"] = shown_source(where["source"], directory, origins)
    first.detail.append(f"{origins[copy]} ran from the bundle's copy {copy} (the same lines)")
