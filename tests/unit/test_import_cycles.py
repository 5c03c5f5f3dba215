"""No module of headscope imports, through any chain of imports, a module that imports it back.

Every ``.py`` under ``src/headscope`` is parsed (nothing is imported). Every import statement counts:
module level, inside functions and under ``TYPE_CHECKING``; a function-level import that closes a
circle is still a sign that code lives in the wrong module. The edges:

- ``import headscope.a.b`` and ``from headscope.a import b`` (``b`` a module) point at ``headscope.a.b``.
- ``from headscope.a import name`` points at the module that defines ``name``: a package
  ``__init__`` that re-exports ``name`` (``from .b import name``) is looked through, following
  re-exports of re-exports, so that a submodule importing a name through its own package is not a
  circle through that package's ``__init__``. A name the ``__init__`` defines itself points at the
  package.
- ``from headscope import name``: the root's names are lazy (its ``__getattr__``), so each points at
  the module that serves it: ``__version__`` the root, the errors ``headscope.errors``, ``Result``
  ``headscope.api.result``, any other ``headscope.api``. The root's own ``__getattr__`` imports are
  therefore not edges of the root.
- Importing ``headscope.a.b`` also runs ``headscope/a/__init__.py``; that implicit edge is not counted
  (a package importing its own submodules is how packages work, and every submodule would otherwise
  sit in a circle with its package).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "headscope"
ROOT = "headscope"
ROOT_NAME_HOMES = {
    "__version__": ROOT,
    "HeadscopeError": "headscope.errors",
    "InputError": "headscope.errors",
    "Result": "headscope.api.result",
}
ROOT_OTHER_NAMES_HOME = "headscope.api"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def module_paths() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(module: str) -> bool:
    path = module_paths().get(module)
    return path is not None and path.name == "__init__.py"


def absolute_base(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = importer.split(".") if is_package(importer) else importer.split(".")[:-1]
    base_parts = package[: len(package) - (node.level - 1)]
    return ".".join(base_parts + ([node.module] if node.module else []))


_READING: set[str] = set()  # packages whose re-exports are being read (a package importing from itself)


@cache
def reexports(package: str) -> dict[str, str]:
    """name -> the module a package ``__init__`` takes it from, for its module-level imports."""
    path = module_paths()[package]
    found: dict[str, str] = {}
    _READING.add(package)
    try:
        for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
            if isinstance(node, ast.ImportFrom):
                base = absolute_base(package, node)
                for alias in node.names:
                    found[alias.asname or alias.name] = resolve_name(base, alias.name)
    finally:
        _READING.discard(package)
    return found


def resolve_name(base: str, name: str) -> str:
    """The module that ``from base import name`` depends on (see the module docstring)."""
    modules = module_paths()
    if f"{base}.{name}" in modules:
        return f"{base}.{name}"
    if base == ROOT:
        return ROOT_NAME_HOMES.get(name, ROOT_OTHER_NAMES_HOME)
    if is_package(base) and base not in _READING and name in reexports(base):
        return reexports(base)[name]
    return base


def imports_of(module: str, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every headscope module that ``module`` depends on, anywhere in its file."""
    path = module_paths().get(module)
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path or module))
    if module == ROOT:
        return []  # its lazy __getattr__ imports are attributed at each import site (resolve_name)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(module, node)
            if base.split(".")[0] != ROOT:
                continue
            found += [(node.lineno, resolve_name(base, alias.name)) for alias in node.names]
    return sorted(
        {(line, target) for line, target in found if target.split(".")[0] == ROOT and target != module}
    )


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it}."""
    graph: dict[str, dict[str, int]] = {}
    for module in module_paths():
        edges: dict[str, int] = {}
        for line, target in imports_of(module):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, {})))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


def one_circle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node]):
                if successor not in members:
                    continue
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if successor not in previous:
                    previous[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no circle in component {component}")


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    circle = one_circle(graph, component)
    steps = []
    for importer, imported in zip(circle, circle[1:], strict=False):
        path = module_paths()[importer].relative_to(SRC.parent)
        steps.append(f"    {path}:{graph[importer][imported]}: {importer} -> {imported}")
    return f"  {len(component)} modules: {', '.join(component)}\n" + "\n".join(steps)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    components = strongly_connected(graph)
    assert not components, "import cycles (one circle shown per group):\n" + "\n".join(
        describe(graph, component) for component in components
    )


def test_a_function_level_reexported_import_is_seen():
    """Imports inside functions, relative ones, and names re-exported by a package all resolve."""
    source = (
        "from headscope import __version__, InputError, Result, scan\n"
        "from . import batch\n"
        "from ..models import LoadedModel\n"
        "def f():\n"
        "    import headscope.sweeps.store\n"
        "    from headscope.capture import Batch\n"
    )
    assert imports_of("headscope.capture.fake", source) == [
        (1, "headscope"),
        (1, "headscope.api"),
        (1, "headscope.api.result"),
        (1, "headscope.errors"),
        (2, "headscope.capture.batch"),
        (3, "headscope.models.layout"),
        (5, "headscope.sweeps.store"),
        (6, "headscope.capture.batch"),
    ]


def test_a_package_importing_a_name_from_itself_is_the_package(tmp_path, monkeypatch):
    """``from headscope.pkg import missing`` inside pkg/__init__.py (a submodule not there yet) ends."""
    package = tmp_path / "headscope" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "headscope" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from headscope.pkg import missing\nfrom .part import name\n")
    (package / "part.py").write_text("name = 1\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "headscope")
    module_paths.cache_clear()
    reexports.cache_clear()
    try:
        assert resolve_name("headscope.pkg", "name") == "headscope.pkg.part"
        assert resolve_name("headscope.pkg", "missing") == "headscope.pkg"
    finally:
        module_paths.cache_clear()
        reexports.cache_clear()


def test_the_cycle_finder_finds_a_circle_and_names_its_lines():
    graph = {
        "headscope.a": {"headscope.b": 3},
        "headscope.b": {"headscope.c": 5},
        "headscope.c": {"headscope.a": 7, "headscope.d": 1},
        "headscope.d": {},
    }
    assert strongly_connected(graph) == [["headscope.a", "headscope.b", "headscope.c"]]
    assert one_circle(graph, ["headscope.a", "headscope.b", "headscope.c"]) == [
        "headscope.a",
        "headscope.b",
        "headscope.c",
        "headscope.a",
    ]
    graph["headscope.c"].pop("headscope.a")
    assert strongly_connected(graph) == []
