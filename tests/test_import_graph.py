"""The import graph of bertscope: no cycles, the core imports no analysis (but through the registry's
two front ends), and the core's subpackages import one way, down the layers of `CORE_LAYERS`.

Imports are read from the source with `ast`, at the top of a module and inside functions
alike: a cycle dodged by a function-level import is still a cycle (the module that seems to
import lazily is tied to the one it imports, and each can break the other when loaded first).
The registry's module names count as imports of the two modules that read them: the command
line (`COMMANDS`) and the report writer (`SECTIONS`, `PAPER_SOURCES`).
"""
from __future__ import annotations

import ast
from pathlib import Path

from bertscope.analyses import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"bertscope": ROOT / "bertscope", "bertscope.kernels": ROOT / "kernels",
            "bertscope.analyses": ROOT / "analyses"}


def project_modules() -> dict[str, Path]:
    """Every module of the project: dotted name -> source file."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `name`'s source imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from package import module` imports the module; `from module import name` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a non-module: its nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    graph["bertscope.cli.main"] |= set(registry.COMMANDS.values())
    graph["bertscope.report.writer"] |= {s.builder.split(":")[0] for s in registry.SECTIONS}
    graph["bertscope.report.writer"] |= {s.split(":")[0] for s in registry.PAPER_SOURCES}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a cycle."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    """The walk finds the modules and the edges it must (a test of the test)."""
    graph = import_graph()
    assert len(graph) >= 100
    assert "bertscope.engine.loop" in graph["bertscope.analyses.surface.command"]
    assert "bertscope.analyses.surface.command" in graph["bertscope.cli.main"]  # a registry edge
    assert "bertscope.kernels.spec" in graph["bertscope.kernels.common"]  # a relative import


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


# the front ends that the registry feeds: the command line (`COMMANDS`) and the report writer (`SECTIONS`,
# `PAPER_SOURCES`). No other module of the core reaches an analysis: what the notebook API and the viewer
# show of the surface statistics is the core's (`bertscope.engine.head_table`, `bertscope.engine.per_example`).
FRONT_ENDS = {"bertscope.cli.main", "bertscope.report.writer"}


def test_the_core_imports_no_analysis():
    """`bertscope/` is the shared core: besides the registry's two front ends, no module of it reaches
    an analysis, and no analysis reaches a front end but the report writer (to refresh a run's page)."""
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("bertscope.analyses") or name.startswith("bertscope.kernels") or name in FRONT_ENDS:
            continue
        reached = {t for t in targets if t == "bertscope.analyses" or t.startswith("bertscope.analyses.")}
        assert not reached, f"{name} imports {sorted(reached)}"
    for name, targets in graph.items():
        if name.startswith("bertscope.analyses"):
            assert not targets & {"bertscope.cli.main", "bertscope.api", "bertscope.view"}, name


# The core's layers, lowest first: a module of the core imports only from its own layer and those below
# (the kernels lie below them all; the analyses are reached only from FRONT_ENDS). Each entry names the
# core's subpackages and top-level modules ("": bertscope/__init__.py, whose `load` imports the API);
# docs/architecture.md draws the same order (`layers_diagram`).
CORE_LAYERS = (
    ("errors", "log", "version", "files"),  # the base: errors, logging, the version, atomic files and run.json
    ("data",),  # the annotated data sets, their downloads, the decoders' weights
    ("text",),  # corpora, sentences, segments, token classes
    ("models",),  # the families' table, loading, the attention plug-in, gates, head removal
    ("engine",),  # batches through the model into accumulators; the per-head table
    ("tasks",),  # task encoders, classifiers, the LM loss
    ("report",),  # the report's page contract, its writer, plots
    ("run",),  # the run directory and the run every command opens (it refreshes the report)
    ("cli", "api", "view", "selftest", ""),  # the front ends
)


def unit_of(module: str) -> str:
    """The core's subpackage or top-level module that `module` belongs to ("" for bertscope itself)."""
    return module.split(".")[1] if module.count(".") else ""


def layer_of() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(CORE_LAYERS) for unit in layer}


def core_units() -> set[str]:
    """Every subpackage and top-level module of bertscope/ (the kernels and the analyses apart)."""
    units = {""}
    for path in (ROOT / "bertscope").iterdir():
        if path.name in ("kernels", "analyses") or path.name.startswith((".", "_")):
            continue
        if path.is_dir() and (path / "__init__.py").is_file() or path.suffix == ".py":
            units.add(path.stem)
    return units


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of the core that climbs from a lower layer to a higher one, as "a -> b"."""
    layer = layer_of()
    out = []
    for name, targets in sorted(graph.items()):
        if not name.startswith("bertscope") or name.startswith(("bertscope.kernels", "bertscope.analyses")):
            continue
        for target in sorted(targets):
            if target.startswith(("bertscope.kernels", "bertscope.analyses")):
                continue
            if layer[unit_of(target)] > layer[unit_of(name)]:
                out.append(f"{name} -> {target}")
    return out


def layers_diagram() -> str:
    """docs/architecture.md's drawing of CORE_LAYERS: the highest layer first, an arrow down between."""
    def word(unit):
        if unit == "":
            return "bertscope.load"
        return f"{unit}/" if (ROOT / "bertscope" / unit).is_dir() else f"{unit}.py"
    return "\n    ↓\n".join("  ".join(word(u) for u in layer) for layer in reversed(CORE_LAYERS))


def test_every_core_module_has_a_layer():
    assert core_units() == set(layer_of()), "CORE_LAYERS must name every subpackage and top-level module once"
    assert sum(map(len, CORE_LAYERS)) == len(layer_of())


def test_upward_imports_are_found():
    graph = {"bertscope.text.segments": {"bertscope.models.architectures", "bertscope.errors"},
             "bertscope.models.loading": {"bertscope.text.segments", "bertscope.kernels.spec"}}
    assert upward_imports(graph) == ["bertscope.text.segments -> bertscope.models.architectures"]


def test_the_core_imports_only_downward():
    """No module of the core imports one of a higher layer (docs/architecture.md, "The core's layers")."""
    assert upward_imports(import_graph()) == []


def test_the_docs_draw_the_layers():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert layers_diagram() in text, f"docs/architecture.md should draw the core's layers as\n{layers_diagram()}"


# the one module of the kernels that reads above them, and why: `triton_aot --commands` compiles the
# specialisation each command launches, found through the registry of commands (issue 48), never a list kept
# in the kernels. It is a maintainer's command (python -m), and no module imports triton_aot but the tests.
READS_THE_REGISTRY = {"bertscope.kernels.triton_aot": {"bertscope.analyses.registry"}}


def test_kernels_import_nothing_above_them():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("bertscope.kernels"):
            above = {t for t in targets if not t.startswith("bertscope.kernels")}
            assert above <= READS_THE_REGISTRY.get(name, set()), (name, above)
    importers = {name for name, targets in graph.items() if "bertscope.kernels.triton_aot" in targets}
    assert not importers, importers
