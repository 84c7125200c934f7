"""The import layering of pyproject.toml's [tool.importlinter] contracts, checked by `lint-imports`:
the client package's layers (no import cycles), the wire layer the server shares, a client that
imports no server code (but through modelinit.sources.embedded) and no torch/numpy/numba/transformers, and
an engine without grpc. import-linter reads the imports inside functions too."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO


def test_import_contracts_hold(tmp_path):
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' (import-linter)")
    # The source trees first on the path: the contracts are about this checkout, installed or not.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "client"), str(REPO / "server"), str(REPO / "proto"),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([exe, "--no-logo", "--cache-dir", str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


def test_server_loads_no_client_module():
    """What the server shares with the client is in modelinit_wire: starting the server's modules
    (service, embedded engine, training) loads no module of the client package."""
    code = ("import sys, modelinit_server.service.command, modelinit_server.service.embedded, modelinit_server.training; "
            "print(sorted(m for m in sys.modules if m == 'modelinit' or m.startswith('modelinit.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_wire_loads_neither_side():
    code = ("import sys, modelinit_wire.v1.modelinit_pb2_grpc, modelinit_wire.events, modelinit_wire.credentials, "
            "modelinit_wire.policy_file, modelinit_wire.constants; "
            "print(sorted(m.partition('.')[0] for m in sys.modules if m.partition('.')[0] in ('modelinit', 'modelinit_server')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def _private_uses_of_architectures(path, package: str) -> list[str]:
    """Where the module at ``path`` (in ``package``) reaches a private name of
    ``modelinit_server.architectures``: a private module (``architectures._fields``), a private name
    imported from one (``from ..architectures.hf import _quiet``), or an attribute of an imported
    architectures module (``hf._config``)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    parts = package.split(".")
    bound: set[str] = set()  # local names bound to an architectures module
    found: list[str] = []

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = parts[: len(parts) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    root = "modelinit_server.architectures"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = absolute(node)
            if not (module == root or module.startswith(root + ".")):
                continue
            if any(p.startswith("_") for p in module[len(root):].split(".") if p):
                found.append(f"{path.name}:{node.lineno}: {module}")
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno}: {module}.{alias.name}")
                elif module == root:  # a submodule of architectures, bound to a local name
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(root + ".") and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{path.name}:{node.lineno}: {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_architectures_is_entered_through_its_public_names_only():
    """No module outside ``modelinit_server/architectures/`` (server, client, wire, benchmarks) uses
    one of its private names: a private module, a private function or attribute of a public one."""
    found = []
    for top, package in (("server", None), ("client", None), ("proto", None), ("benchmarks", "benchmarks")):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO / top)
            if rel.parts[:2] == ("modelinit_server", "architectures") or "v1" in rel.parts:
                continue
            name = package or ".".join(rel.with_suffix("").parts)
            pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
            found += _private_uses_of_architectures(path, pkg.removesuffix(".__init__"))
    assert found == [], found


def test_the_private_name_check_finds_each_kind_of_use(tmp_path):
    """The check above fails on each way a private name can be reached (so it is not vacuous)."""
    src = tmp_path / "run.py"
    src.write_text("from ..architectures import hf\nfrom ..architectures.recorder import _clear_flags\n"
                   "from ..architectures._fields import invalid\nimport modelinit_server.architectures._family\n"
                   "hf._quiet()\nhf.build()\n")
    found = _private_uses_of_architectures(src, "modelinit_server.probe")
    assert [f.split(": ")[1] for f in found] == [
        "modelinit_server.architectures.recorder._clear_flags", "modelinit_server.architectures._fields",
        "modelinit_server.architectures._family", "hf._quiet"], found


def _test_module_imports(path) -> list[str]:
    """The test modules (``test_*``) ``path`` imports, absolutely or relatively."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        found += [n for n in names if any(part.startswith("test_") for part in n.split("."))]
    return sorted(set(found))


def test_no_test_module_imports_another():
    """tests/README.md: what several test modules share is in tests/support, imported absolutely; a
    test module never imports another (pytest would collect its tests twice under two names, and a
    change to one test breaks another)."""
    offenders = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = path.relative_to(REPO / "tests")
        if rel.parts[0].startswith(".") or "node_modules" in rel.parts:
            continue  # installed stacks and tools, not ours
        imported = _test_module_imports(path)
        if imported:
            offenders[str(rel)] = imported
    assert offenders == {}, offenders


def test_the_test_import_check_finds_each_form(tmp_path):
    forms = {"from tests.server.training.test_megatron import HF": ["tests.server.training.test_megatron",
                                                                   "tests.server.training.test_megatron.HF"],
             "from .test_torchtitan import SEED": ["test_torchtitan", "test_torchtitan.SEED"],
             "import tests.client.test_cli": ["tests.client.test_cli"],
             "from tests.support import test_data_helpers": ["tests.support.test_data_helpers"]}
    for code, want in forms.items():
        (tmp_path / "m.py").write_text(code + "\n")
        assert _test_module_imports(tmp_path / "m.py") == want, code
    (tmp_path / "m.py").write_text("from tests.support.megatron_models import HF\nimport pytest\n")
    assert _test_module_imports(tmp_path / "m.py") == []


def test_the_folders_stand_in_the_order_of_the_package_layers():
    """The contract ``folders-in-order`` orders the packages; each layer's packages live in one folder,
    and the folders, top to bottom, are client/, server/, proto/: so no import climbs from a lower
    folder to a higher one (modelinit_host, which the server imports, sat in client/ until 2026-11-28)."""
    import importlib

    tomllib = pytest.importorskip("tomllib")
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "folders-in-order"]
    folders = []
    for layer in layers:
        found = {pathlib.Path(importlib.import_module(name.strip()).__file__).resolve().parents[1].name
                 for name in layer.split("|")}
        assert len(found) == 1, (layer, found)
        folders.append(found.pop())
    assert folders == ["client", "server", "proto"]
    roots = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])
    assert roots == {name.strip() for layer in layers for name in layer.split("|")}  # every package has its place
