"""The house's import graph: modules of the zoo package (zoo.export included) import one way.

Every `import` and `from … import` is read with ast, inside functions too (a deferred import is
still a dependency). Checked: no circle between any two modules; the layers below never reach up
(tasks → models → … → export → builder/release/hub → CLI); the streaming runtime reaches only the
torch-free checking layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import zoo

ROOT = Path(zoo.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in found:  # the deepest zoo module the name refers to
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "zoo":
                    targets.add(target)
        graph[name] = targets
    return graph


GRAPH = _graph()


def test_the_graph_was_read():
    assert {"zoo.export.streaming", "zoo.export.onnx_export", "zoo.builder", "zoo.manifest"} <= set(GRAPH)
    assert "zoo.manifest" in GRAPH["zoo.export.streaming"] and "zoo.export.onnx_export" in GRAPH["zoo.builder"]


def test_no_circles():
    """Tarjan's strongly connected components: every one is a single module."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []


# What each lower layer may import from the zoo (besides itself): nothing above it.
BELOW = {
    "zoo.export.streaming": ("zoo.export.graph_files", "zoo.export.scan_graph", "zoo.export.token_io", "zoo.locate",
                             "zoo.manifest", "zoo.names", "zoo.atomic", "zoo.version"),
    "zoo.export.scan_graph": ("zoo.export.graph_files", "zoo.manifest"),
    "zoo.export.graph_files": ("zoo.manifest",),
    "zoo.export.token_io": ("zoo.manifest", "zoo.atomic"),
    "zoo.locate": ("zoo.manifest", "zoo.names", "zoo.version", "zoo.atomic"),
    "zoo.manifest": ("zoo.names", "zoo.version"),
}
ABOVE_EXPORT = ("zoo.builder", "zoo.release", "zoo.hub", "zoo.hub_server", "zoo.hub_prepare", "zoo.cli",
                "zoo.quickstart", "zoo.sweep", "zoo.report", "zoo.leaderboard", "zoo.benchmark")


@pytest.mark.parametrize("module", sorted(BELOW))
def test_the_checking_and_streaming_layers_import_only_below_them(module):
    assert GRAPH[module] <= set(BELOW[module]), sorted(GRAPH[module] - set(BELOW[module]))


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith(("zoo.export", "zoo.models", "zoo.tasks"))))
def test_export_models_and_tasks_never_reach_up(module):
    """zoo.export is used by the builder, the release and the CLI, and uses only what is below it."""
    assert not {m for m in GRAPH[module] if m.startswith(ABOVE_EXPORT)}
    if module.startswith(("zoo.models", "zoo.tasks")):
        assert not {m for m in GRAPH[module] if m.startswith("zoo.export")}
