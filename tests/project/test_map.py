"""The maps stay true: docs/architecture.md names every module of the four packages,
tests/README.md's helper table names every module of tests/support, and every Sphinx-style cross
reference in the packages' docstrings and comments names something that exists.

The convention of docs/architecture.md: each package has a tree, the first code block after its
heading (``## The client, top to bottom`` for ``modelinit``, ``## The server, top to bottom`` for
``modelinit_server``, ``## The wire, top to bottom`` for ``modelinit_wire``, ``## The host, top to bottom`` for
``modelinit_host``). An entry line starts
at two spaces per folder level with its names, ``a | b | c`` (``name`` for ``name.py``, ``name/``
for a subpackage, whose entries follow two spaces deeper), then two or more spaces and what they
hold; a line indented deeper than an entry could be continues the text above it. Every module must
be an entry of its package's tree, and every entry must be a module or a subpackage. Not entries:
``__init__.py`` (the folder's entry stands for it) and what is inside a ``v1/`` folder (the
generated stubs, and the client's re-export of them): ``v1/`` itself is an entry.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGES = {  # heading of its tree in docs/architecture.md -> (package, its folder)
    "The client, top to bottom": ("modelinit", REPO / "client" / "modelinit"),
    "The server, top to bottom": ("modelinit_server", REPO / "server" / "modelinit_server"),
    "The wire, top to bottom": ("modelinit_wire", REPO / "proto" / "modelinit_wire"),
    "The host, top to bottom": ("modelinit_host", REPO / "proto" / "modelinit_host"),
}
ARCHITECTURE = REPO / "docs" / "architecture.md"
TESTS_README = REPO / "tests" / "README.md"
SUPPORT = REPO / "tests" / "support"

_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.py|/)?")


def _modules(folder: Path) -> set[str]:
    """The tree entries ``folder`` must have: ``a/b.py`` as ``a/b``, subpackages as ``a/``."""
    found = set()
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if "__pycache__" in rel.parts or "v1" in rel.parts[:-1]:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            found.add(rel.as_posix() + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.add(rel.with_suffix("").as_posix())
    return found


def _code_block_after(text: str, heading: str) -> list[str] | None:
    start = text.find(f"## {heading}\n")
    if start < 0:
        return None
    lines = text[start:].splitlines()
    opening = next(i for i, line in enumerate(lines) if line.startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1:closing]


def _tree_entries(lines: list[str]) -> tuple[set[str], list[str]]:
    """The entries of a tree (as :func:`_modules` names them), and the lines that are not well formed."""
    entries: set[str] = set()
    bad: list[str] = []
    folders: list[tuple[int, str]] = []  # (indent, "a/b/") of the open folders
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        while folders and folders[-1][0] >= indent:
            folders.pop()
        depth = len(folders)
        if indent > 2 * depth:
            continue  # the text of the entry above, continued
        if indent != 2 * depth:
            bad.append(line)
            continue
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split(" | ")
        if not all(_NAME.fullmatch(n) for n in names):
            bad.append(line)
            continue
        parent = folders[-1][1] if folders else ""
        for n in names:
            n = n.removesuffix(".py")
            entries.add(parent + n)
            if n.endswith("/"):
                folders.append((indent, parent + n))
    return entries, bad


def test_architecture_names_every_module():
    text = ARCHITECTURE.read_text()
    problems = []
    for heading, (package, folder) in PACKAGES.items():
        block = _code_block_after(text, heading)
        if block is None:
            problems.append(f"{package}: no '## {heading}' section (its tree)")
            continue
        entries, bad = _tree_entries(block)
        modules = _modules(folder)
        problems += [f"{package}: a malformed tree line under '## {heading}': {line!r}" for line in bad]
        problems += [f"{package}: {m} ({folder.relative_to(REPO)}/{m.rstrip('/')}{'' if m.endswith('/') else '.py'}) "
                     f"is not in the tree under '## {heading}'" for m in sorted(modules - entries)]
        problems += [f"{package}: the tree under '## {heading}' names {e}, which is no module or package of "
                     f"{folder.relative_to(REPO)}" for e in sorted(entries - modules)]
    assert not problems, "docs/architecture.md is out of date:\n" + "\n".join(problems)


def test_tests_readme_names_every_support_module():
    text = TESTS_README.read_text()
    start = text.index("## Shared helpers and data: tests/support")
    table = [line for line in text[start:].splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([^`]+)`", line.split("|")[1])}
    modules = {p.stem for p in SUPPORT.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(modules - named)
    assert "tests/support/__init__.py" in named, "tests/README.md's helper table has no row for tests/support/__init__.py"
    assert not missing, f"tests/README.md's helper table (tests/support) has no row for: {', '.join(missing)}"
    stale = sorted(named - modules - {"tests/support/__init__.py"})
    assert not stale, f"tests/README.md's helper table names modules tests/support does not have: {', '.join(stale)}"


# :role:`target`, :role:`~target`, :role:`.target`, :role:`title <target>`
_REFERENCE = re.compile(r":(mod|func|class|meth|data|attr):`([^`]+)`")


def _module_name(package: str, folder: Path, path: Path) -> str:
    rel = path.relative_to(folder).with_suffix("")
    parts = [package, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute reached from one by getattr."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for i, attr in enumerate(parts[cut:], cut + 1):
                if i == len(parts) and isinstance(obj, type) and _instance_attribute(obj, attr):
                    return True
                obj = getattr(obj, attr)
        except AttributeError:
            try:  # a submodule not imported by its package yet
                importlib.import_module(".".join(parts[:cut + 1]))
            except ImportError:
                return False
            return _resolve(dotted) if cut < len(parts) else True
        return True
    return False


def _instance_attribute(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: annotated in a class of its MRO, or assigned to
    ``self.name`` in one's source."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}) or name in getattr(klass, "__slots__", ()):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=]+)?=", source):
            return True
    return False


def _candidates(target: str, module: str, is_package: bool, classes: list[str]) -> list[str]:
    """Where Sphinx would look for ``target`` written in ``module``, inside ``classes`` (outermost first)."""
    if target.startswith("."):
        package = module if is_package else module.rpartition(".")[0]
        return [module + target, package + target]
    scopes = [".".join([module, *classes[:i]]) for i in range(len(classes), -1, -1)]
    return [f"{scope}.{target}" for scope in scopes] + [target]


def _references(path: Path):
    """(line, role, target, enclosing classes) of every reference in the file's strings and comments."""
    source = path.read_text()
    tree = ast.parse(source)
    spans = [(n.lineno, n.end_lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        for match in _REFERENCE.finditer(token.string):
            line = token.start[0] + token.string.count("\n", 0, match.start())
            target = match.group(2)
            if "<" in target:
                target = target[target.index("<") + 1:target.rindex(">")]
            target = target.strip().removeprefix("~")
            classes = [name for first, last, name in sorted(spans) if first <= line <= last]
            yield line, match.group(1), target, classes


@pytest.mark.slow
def test_cross_references_resolve():
    broken = []
    for package, folder in PACKAGES.values():
        for path in sorted(folder.rglob("*.py")):
            if "v1" in path.relative_to(folder).parts:
                continue  # generated
            module = _module_name(package, folder, path)
            for line, role, target, classes in _references(path):
                found = _candidates(target, module, path.name == "__init__.py", classes)
                if not any(_resolve(c) for c in found):
                    broken.append(f"{path.relative_to(REPO)}:{line}: :{role}:`{target}` (tried {', '.join(found)})")
    assert not broken, "cross references to nothing:\n" + "\n".join(broken)
