"""The arrows run one way: generator -> core <- runtime <- generated.

Checked by importing, not by reading: each package's modules are imported in a fresh
interpreter, and what that pulled into ``sys.modules`` is the claim. ``core`` loads nothing of
``runtime``, ``generator`` or ``generated``; importing any ``runtime`` module loads nothing of
``generated`` or ``generator`` (the CLI imports those lazily, inside the commands that need them).
A second, static pass over the source refuses such an import anywhere in ``core``, even inside a
function, where the dynamic check cannot see it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


OUTER = ("runtime", "generator", "generated")
PACKAGES = ("core", "runtime", "generator", "generated", "benchmarks")


def modules(package: str) -> list[str]:
    return sorted(
        f"specbind.{package}.{p.stem}" if p.stem != "__init__" else f"specbind.{package}"
        for p in (REPO / package).glob("*.py")
    )


def loaded_after_importing(names: list[str]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout)
    return loaded


def _top(name: str) -> str:
    """The design package a module belongs to: ``specbind.runtime.tp`` -> ``runtime``."""
    parts = name.split(".")
    return parts[1] if parts[0] == "specbind" and len(parts) > 1 else parts[0]


def test_core_imports_nothing_of_runtime_generator_or_generated() -> None:
    loaded = loaded_after_importing(modules("core"))
    assert len(modules("core")) >= 6
    assert [m for m in loaded if _top(m) in OUTER] == []


@pytest.mark.parametrize("module", modules("runtime"))
def test_a_runtime_module_loads_nothing_of_generated_or_generator(module: str) -> None:
    loaded = loaded_after_importing([module])
    assert [m for m in loaded if _top(m) in ("generated", "generator")] == []


def test_no_core_source_imports_the_outer_packages_even_inside_a_function() -> None:
    found = []
    for path in sorted((REPO / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if _top(n) in OUTER]
    assert found == []


def test_the_generator_reaches_the_runtime_only_for_atomic_writes() -> None:
    """The generator parses specs into core's IR; it needs no binding or I/O code of runtime's
    beyond the atomic file writer (shared so generated/ is written as --out files are)."""
    used = set()
    for path in sorted((REPO / "generator").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _top(node.module) == "runtime":
                used.add(node.module)
    assert used <= {"specbind.runtime.atomic"}


def _code_imports(text: str) -> list[str]:
    """What a string imports if it is Python code (a ``python -c`` script); prose does not
    parse, and then imports nothing."""
    if "import" not in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def _imports(path: Path) -> list[str]:
    """Modules imported by ``path``, and by the code it hands to ``python -c`` in strings."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names += _code_imports(node.value)
        elif isinstance(node, ast.JoinedStr):  # an f-string: each {...} read as a name
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "x"
                for v in node.values
            )
            names += _code_imports(text)
    return names


def test_every_import_of_the_project_goes_through_the_specbind_namespace() -> None:
    """Installed, the folders live only under ``specbind``: a bare ``import runtime`` would work
    in the repository (its root is on sys.path) and fail in an engine's environment, or load a
    second copy of a module beside ``specbind.runtime``."""
    sources = [p for d in (*PACKAGES, "tests") for p in sorted((REPO / d).rglob("*.py"))]
    sources += sorted((REPO / "specbind").glob("*.py"))
    bare = [
        f"{p.relative_to(REPO)}: {n}"
        for p in sources
        for n in _imports(p)
        if n.split(".")[0] in PACKAGES
    ]
    assert len(sources) > 80
    assert bare == []
