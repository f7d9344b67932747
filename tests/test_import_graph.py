"""The import graph of ``scheduler/``: no cycles, and the layers of DESIGN.md.

How it is checked: every ``*.py`` under ``scheduler/`` is parsed with :mod:`ast` (nothing is
imported or run) and each ``import`` / ``from ... import`` statement anywhere in the file, at
module level or inside a function or method, becomes an edge from that module to the
``scheduler`` module it names. A lazy import inside a function still ties the two modules
together in the design, so it counts. Relative imports are resolved against the importing
module's package; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module and
to ``pkg`` otherwise. Excluded: imports under ``if TYPE_CHECKING:`` (they exist for the type
checker only and are never executed).

Two rules:

* No cycle: the strongly connected components of the graph all have one module (a package's
  ``__init__`` importing its own submodules is an edge like any other, so a submodule that
  imports its package's ``__init__`` back forms a cycle too).
* Layers (DESIGN.md, Layout): ``scheduler/core`` imports nothing from ``scheduler/runtime``,
  ``scheduler/server``, ``scheduler/kube`` or ``scheduler/cli``; ``scheduler/runtime`` imports
  nothing from ``scheduler/server``, ``scheduler/kube`` or ``scheduler/cli``. (The pure-core rule,
  no I/O frameworks in ``scheduler/core`` and ``topology/``, is tests/test_purity.py.)

``.ci/run`` runs the whole suite, this file with it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "scheduler"


def _module_name(path: Path) -> str:
    """The dotted module name of a file under the repository (``pkg/__init__.py`` -> ``pkg``)."""
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> dict[str, Path]:
    """Every module under ``scheduler/``, by dotted name."""
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """True for ``if TYPE_CHECKING:`` and ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` at any depth, except the body of ``if TYPE_CHECKING:``
    (its ``else:`` branch is kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _targets(
    module: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    """The ``scheduler`` modules one import statement of ``module`` (file ``path``) loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return {_known_prefix(n, known) for n in names if n.split(".")[0] == "scheduler"} - {""}
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] != "scheduler":
        return set()
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if sub in known else _known_prefix(base, known))
    return found - {""}


def _known_prefix(name: str, known: set[str]) -> str:
    """The longest prefix of dotted ``name`` that is a known module ("" when none)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return ""


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``scheduler`` modules it imports (self-edges dropped)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for node in _import_nodes(tree):
            edges |= _targets(module, path, node, known)
        graph[module] = edges - {module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete cycle through the first module of a component, for the failure message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return component


def test_graph_sees_the_modules_and_their_lazy_imports() -> None:
    """The parser itself: every module is in the graph, module-level and lazy imports (one
    inside a function: ``cmd_demo`` loads the demo) are edges, and an import under
    ``if TYPE_CHECKING:`` is not (the gang policy registry names ``GangRequest`` only for
    the type checker)."""
    graph = import_graph()
    assert len(graph) == len(list(ROOT.rglob("*.py")))
    for package in ("scheduler.core", "scheduler.runtime", "scheduler.server", "scheduler.kube"):
        assert package in graph
    assert "scheduler.core.snapshot" in graph["scheduler.runtime.cache"]
    assert "scheduler.cli.demo" in graph["scheduler.cli.main"]  # inside cmd_demo
    assert "scheduler.core.gang" not in graph["scheduler.core.policies.registry"]


def test_strongly_connected_finds_every_cycle() -> None:
    """Tarjan on a small graph: two cycles (one through three modules), a chain, a loner."""
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": {"e"},
        "e": {"d"},
        "f": {"a"},
        "g": set(),
    }
    comps = strongly_connected(graph)
    assert [c for c in comps if len(c) > 1] == [["a", "b", "c"], ["d", "e"]]
    assert sorted(x for c in comps for x in c) == sorted(graph)
    assert _cycle_in(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_scheduler() -> None:
    graph = import_graph()
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    lines = [
        f"{len(c)} modules: {', '.join(c)}\n    e.g. {' -> '.join(_cycle_in(c, graph))}"
        for c in cycles
    ]
    assert not cycles, f"{len(cycles)} import cycle(s) in scheduler/:\n" + "\n".join(lines)


LAYERS = {
    "scheduler.core": ("scheduler.runtime", "scheduler.server", "scheduler.kube", "scheduler.cli"),
    "scheduler.runtime": ("scheduler.server", "scheduler.kube", "scheduler.cli"),
}
"""Each lower layer and the upper layers it must not import (DESIGN.md, Layout)."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_layers_import_only_downwards() -> None:
    graph = import_graph()
    problems = [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph.items())
        for dst in sorted(dsts)
        for lower, banned in LAYERS.items()
        if _within(src, lower) and any(_within(dst, b) for b in banned)
    ]
    assert not problems, "layer rule broken:\n" + "\n".join(problems)
