"""The arrows run one way: generator -> core <- runtime <- generated <- tools.

Checked by reading every source, not by importing: an import inside a function (a lazy import)
is an arrow as much as one at the top, and importing a module only shows what its top level
pulls in. Every ``import`` and ``from … import`` anywhere in a file (functions included), and
every import in a string handed to ``python -c``, is an edge from that module to the module it
names. The layers:

- ``core``: the spec IR, shape algebra, plan math and name patterns; imports nothing else of the
  project;
- ``runtime``: the loader library; imports only ``core``. Inside it, every module lives in a
  wing (``runtime/<wing>/``), and each wing imports only the wings below it, in the order of
  ``WINGS`` (``io`` at the bottom, ``ranks`` at the top);
- ``generated``: the emitted binders; import ``core``, and runtime only through its contract
  module ``runtime.binder`` (the package itself, never one of its modules);
- ``generator``: imports ``core`` (and ``runtime.io.atomic`` for its file writes);
- the tools (``specbind/*.py``, ``specbind/synth``): anything of the package;
- ``benchmarks``: the benchmark suite, its hand-written baselines and GPU checks, above
  everything: it may import anything, and nothing of the package imports it (it runs from a
  clone, never ships in the wheel).

and no two modules import each other, directly or through others (no cycle at all). An import
under ``if TYPE_CHECKING:`` never runs: it counts for the layers and wings, not for cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "runtime", "generator", "generated")
# What each layer may import of the project, besides itself.
ALLOWED = {
    "core": set(),
    "runtime": {"core"},
    "generated": {"core", "runtime"},
    "generator": {"core", "runtime.io.atomic"},
}
# runtime's wings, bottom first: each may import only the wings before it.
WINGS = ("io", "binder", "layout", "quant", "bind", "bound", "ranks")
CONTRACT = "specbind.runtime.binder"  # the one runtime module generated code imports
TOOL_DIRS = ("synth",)
LAB_DIRS = ("benchmarks", "benchmarks/baselines")  # above everything, never in the wheel


def _module_name(path: Path) -> str:
    """``runtime/binder/tp.py`` -> ``specbind.runtime.binder.tp``; ``benchmarks/main.py`` ->
    ``benchmarks.main``; a package's ``__init__`` is the package."""
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] not in ("specbind", "benchmarks"):
        parts.insert(0, "specbind")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Every project module by its ``specbind.`` name (the real files, not the links)."""
    paths = [p for d in LAYERS for p in sorted((REPO / d).glob("*.py"))]
    paths += sorted((REPO / "runtime").glob("*/**/*.py"))  # the wings, and anything deeper
    paths += sorted((REPO / "specbind").glob("*.py"))
    paths += [p for d in TOOL_DIRS for p in sorted((REPO / "specbind" / d).glob("*.py"))]
    paths += [p for d in LAB_DIRS for p in sorted((REPO / d).glob("*.py"))]
    return {_module_name(p): p for p in paths}


def layer_of(module: str) -> str:
    """``specbind.runtime.binder.tp`` -> ``runtime``; ``benchmarks.main`` -> ``benchmarks``; a
    tool module -> ``tools``."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return "benchmarks"
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "tools"


def wing_of(module: str) -> str | None:
    """``specbind.runtime.binder.tp`` -> ``binder``; the package ``specbind.runtime`` and any
    module outside runtime -> None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" else None


def _code_imports(text: str) -> list[ast.AST]:
    """The import nodes of a string that is Python code (a ``python -c`` script); prose does
    not parse, and then imports nothing."""
    if "import" not in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _typing_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def _import_nodes(tree: ast.AST, strings: bool = True, typing: bool = True) -> list[ast.AST]:
    nodes: list[ast.AST] = []
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            nodes.append(node)
        elif not strings:
            continue
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            nodes += _code_imports(node.value)
        elif isinstance(node, ast.JoinedStr):  # an f-string: each {...} read as a name
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "x"
                for v in node.values
            )
            nodes += _code_imports(text)
    return nodes


def imported(path: Path, known: set[str], strings: bool = True, typing: bool = True) -> list[str]:
    """The names ``path`` imports, anywhere in it: ``from a.b import c`` is ``a.b.c`` when
    that is a module of the project, else ``a.b``. With ``strings``, code in string literals
    counts too (a ``python -c`` script runs as this module's child)."""
    out: list[str] = []
    for node in _import_nodes(ast.parse(path.read_text()), strings, typing):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            hits = [s for s in subs if s in known]
            out += hits if hits else [node.module]
    return out


def edges(typing: bool = True) -> dict[str, set[str]]:
    """module -> the project modules it imports (the package ``specbind`` itself excluded: its
    ``__init__`` is the public facade, a tool). The generator's strings are the code it emits
    (generated/'s imports, checked there), so they are not read as the generator's own."""
    found = sources()
    known = set(found)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        strings = layer_of(name) != "generator"
        graph[name] = {
            n
            for n in imported(path, known, strings, typing)
            if n in known and n != name and n != "specbind"
        }
    return graph


def test_the_sources_read_are_the_whole_project() -> None:
    found = sources()
    assert len(found) > 80
    assert "specbind.runtime.bind.bind" in found and "specbind.cli" in found
    assert "benchmarks.main" in found and "specbind.synth" in found
    assert "benchmarks.baselines.vllm_style" in found and "specbind.bench" in found


def test_nothing_of_the_package_imports_the_benchmark_suite() -> None:
    """``benchmarks/`` is not in the wheel: an import of it from the package, lazy or in a
    ``python -c`` string, would fail in every installed copy."""
    bad = [
        f"{m} -> {t}"
        for m, ts in edges().items()
        if layer_of(m) != "benchmarks"
        for t in ts
        if layer_of(t) == "benchmarks"
    ]
    assert bad == []


def test_the_suite_check_sees_an_import_of_the_benchmark_suite(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from benchmarks.main import run\n")
    assert imported(src, {"benchmarks.main"}) == ["benchmarks.main"]
    assert layer_of("benchmarks.main") == "benchmarks" and layer_of("specbind.bench") == "tools"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = ALLOWED[layer] | {layer}
    bad = []
    for module, targets in edges().items():
        if layer_of(module) != layer:
            continue
        for t in targets:
            t_layer = layer_of(t)
            dotted = t.removeprefix("specbind.")
            if t_layer not in allowed and dotted not in allowed:
                bad.append(f"{module} -> {t}")
    assert bad == []


def test_runtime_imports_nothing_above_it_even_inside_a_function() -> None:
    """The claim the layer rule makes, spelled out for the loader library: no runtime module
    reaches generated code, the generator, the API facade or any tool, lazily or not."""
    bad = [
        f"{m} -> {t}"
        for m, ts in edges().items()
        if layer_of(m) == "runtime"
        for t in ts
        if layer_of(t) != "runtime" and layer_of(t) != "core"
    ]
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other_even_through_others() -> None:
    assert _cycles(edges(typing=False)) == []


def test_the_cycle_check_finds_a_cycle_when_there_is_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_a_typing_only_import_is_no_cycle_edge(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("if TYPE_CHECKING:\n    import specbind.api\nimport specbind.core\n")
    known = {"specbind.api", "specbind.core"}
    assert sorted(imported(src, known)) == ["specbind.api", "specbind.core"]
    assert imported(src, known, typing=False) == ["specbind.core"]


def test_a_lazy_import_is_an_edge(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from specbind.generated import MODELS\nCODE = 'import specbind.api'\n"
    )
    assert imported(src, {"specbind.generated"}) == ["specbind.generated", "specbind.api"]


def test_runtime_holds_the_loader_library_only() -> None:
    """At most 32 modules, none of them a command, a report, a synthesizer or a benchmark."""
    names = [p.stem for p in (REPO / "runtime").rglob("*.py") if p.stem != "__init__"]
    assert len(names) <= 32, names
    assert [n for n in names if n.startswith(("bench", "synth", "cli", "audit"))] == []


def test_runtime_has_no_module_outside_a_wing() -> None:
    """Every runtime module is ``runtime/<wing>/<module>.py`` for a wing of ``WINGS``; only the
    package's ``__init__`` lies at the top, and it imports nothing."""
    root = REPO / "runtime"
    outside = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p != root / "__init__.py"
        and (len(p.relative_to(root).parts) != 2 or p.relative_to(root).parts[0] not in WINGS)
    ]
    assert outside == []
    assert sorted(p.parent.name for p in root.glob("*/__init__.py")) == sorted(WINGS)
    assert edges()["specbind.runtime"] == set()


def wing_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each edge from a runtime wing to a wing at or above it in ``WINGS`` (its own excepted),
    and each edge from a runtime module outside any wing."""
    bad = []
    for module, targets in graph.items():
        if layer_of(module) != "runtime":
            continue
        wing = wing_of(module)
        for t in targets:
            to = wing_of(t)
            if to is None or wing == to:
                continue
            if wing is None or WINGS.index(to) > WINGS.index(wing):
                bad.append(f"{module} -> {t}")
    return sorted(bad)


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_imports_only_the_wings_below_it(wing: str) -> None:
    """One-way arrows: ``io`` imports no other wing, ``binder`` only ``io``, …, ``ranks`` any;
    so the wings hold no cycle between them, even through type-only imports."""
    bad = [v for v in wing_violations(edges()) if wing_of(v.split(" -> ")[0]) == wing]
    assert bad == []


def test_the_wing_check_finds_an_upward_arrow() -> None:
    up = {"specbind.runtime.io.source": {"specbind.runtime.bind.bind"}}
    down = {"specbind.runtime.bind.bind": {"specbind.runtime.io.source"}}
    assert wing_violations(up) == ["specbind.runtime.io.source -> specbind.runtime.bind.bind"]
    assert wing_violations(down) == []


def test_generated_code_imports_runtime_only_through_its_contract_module() -> None:
    """``from specbind.runtime.binder import …`` and nothing else of runtime: the names there
    are the whole contract between runtime and generated code."""
    bad = [
        f"{m} -> {t}"
        for m, ts in edges().items()
        if layer_of(m) == "generated"
        for t in ts
        if layer_of(t) == "runtime" and t != CONTRACT
    ]
    used = {t for m, ts in edges().items() if layer_of(m) == "generated" for t in ts}
    assert CONTRACT in used
    assert bad == []


def test_every_import_of_the_project_goes_through_the_specbind_namespace() -> None:
    """Installed, the folders live only under ``specbind``: a bare ``import runtime`` would work
    in the repository (its root is on sys.path) and fail in an engine's environment, or load a
    second copy of a module beside ``specbind.runtime``. ``benchmarks`` is a bare name on
    purpose (the clone's suite, imported from the clone by itself and the tests only; the
    package never imports it: the check above)."""
    paths = list(sources().values()) + sorted((REPO / "tests").rglob("*.py"))
    paths += sorted((REPO / "examples").glob("*.py"))
    bare = []
    for p in paths:
        for node in _import_nodes(ast.parse(p.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            bare += [f"{p.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in LAYERS]
    assert len(paths) > 80
    assert bare == []
