"""The package's layers point one way: no module imports a higher layer or a sibling package.

Every ``.py`` under ``src/headscope`` is parsed (nothing is imported), and every import statement is
read: module level, inside functions, under ``TYPE_CHECKING``, and relative imports resolved to
absolute names. Within one package anything goes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "headscope"

# Low to high. A module may import its own group and any group of a lower layer; never a higher
# layer, and never another group of its own layer.
LAYERS: list[tuple[int, list[str]]] = [
    # The leaf: the package root (only for __version__), errors, file writing (which raises
    # errors' OutputError), and core/: the registries' live mapping, the role spec (a plain record that detectors and weights, siblings,
    # both declare their roles with) and the weight-only tables' specs (detectors check role labels
    # against them), and the reader of the JSON Schemas headscope publishes. One group, so files may
    # import errors.
    (0, ["leaf"]),
    (1, ["models", "data"]),
    # capture takes its model duck-typed; models decide the capture mode without importing it
    # (capture.prepared switches the attention implementation when an analysis runs).
    (2, ["capture"]),
    (3, ["detectors", "weightroles"]),
    (4, ["verdicts"]),
    # The extension API: what every analysis, built-in or plugin, is built from (protocol, options,
    # checks, the ablation engine, shared inputs, rendering helpers). It knows no analysis.
    (5, ["extend"]),
    (6, ["analyses"]),
    (7, ["outputs", "sweeps"]),
    # The public Python API: headscope.api (its functions) and headscope.api.result (Result).
    (8, ["api"]),
    (9, ["cli"]),
]
LEAF_MODULES = {
    "headscope",
    "headscope.errors",
    "headscope.files",
    "headscope.core",
    "headscope.core.registry",
    "headscope.core.rolespec",
    "headscope.core.weighttables",
    "headscope.core.schemacheck",
    "headscope.core.held",
}
LEVEL = {group: level for level, groups in LAYERS for group in groups}
# Names imported from the package root other than __version__ are the API's lazy exports.
ROOT_LEAF_NAMES = {"__version__"}
ROOT_EXPORTS_GROUP = "api"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def known_modules() -> set[str]:
    return {module_name(p) for p in PACKAGE.rglob("*.py")}


def group_of(module: str) -> str:
    """``headscope.analyses.scan`` -> ``analyses``; the leaf modules -> ``leaf``."""
    if module in LEAF_MODULES:
        return "leaf"
    return module.split(".")[1]


def imports(path: Path, modules: set[str], source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) for every headscope module ``path`` imports, anywhere in the file."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    text = path.read_text(encoding="utf-8") if source is None else source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.append((node.lineno, submodule))
                elif base == "headscope" and alias.name not in ROOT_LEAF_NAMES:
                    found.append((node.lineno, f"headscope.{ROOT_EXPORTS_GROUP}"))
                else:
                    found.append((node.lineno, base))
    return sorted((line, target) for line, target in found if target.split(".")[0] == "headscope")


def offending_edges() -> list[str]:
    modules = known_modules()
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        if importer == "headscope":
            continue  # the root's lazy exports of headscope.api are its job, not an upward arrow
        source = group_of(importer)
        where = path.relative_to(SRC.parent)
        if source not in LEVEL:
            problems.append(f"{where}:1: {importer} is in no layer (add its group to LAYERS)")
            continue
        for line, target in imports(path, modules):
            group = group_of(target)
            if group == source:
                continue
            if group not in LEVEL:
                problems.append(f"{where}:{line}: {importer} -> {target} (no layer for {group!r})")
            elif LEVEL[group] >= LEVEL[source]:
                problems.append(
                    f"{where}:{line}: {importer} -> {target} (layer {LEVEL[source]} -> layer {LEVEL[group]})"
                )
    return problems


def test_imports_point_down_the_layers():
    problems = offending_edges()
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


def test_every_import_is_seen():
    """Function-local, relative and ``from . import`` forms resolve to absolute modules."""
    modules = known_modules() | {"headscope.outputs.fake"}
    path = PACKAGE / "outputs" / "fake.py"
    source = (
        "from headscope import __version__, capture, scan\n"
        "from . import report\n"
        "from ..extend import base\n"
        "from .views import heatmap\n"
        "def f():\n"
        "    import headscope.sweeps.store\n"
        "    from headscope.cli import app\n"
    )
    assert imports(path, modules, source) == [
        (1, "headscope"),
        (1, "headscope.api"),
        (1, "headscope.capture"),
        (2, "headscope.outputs.report"),
        (3, "headscope.extend.base"),
        (4, "headscope.outputs.views"),
        (6, "headscope.sweeps.store"),
        (7, "headscope.cli"),
    ]


@pytest.mark.parametrize(
    "modules",
    [
        "headscope.analyses, headscope.outputs.report",
        "headscope.files, headscope.extend.show, headscope.extend.examples, headscope.outputs.views, "
        "headscope.outputs.report_data, headscope.sweeps.results, headscope.verdicts.heads",
    ],
)
def test_the_core_imports_without_typer(modules):
    code = f"import sys, {modules}; assert 'typer' not in sys.modules, 'typer was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_analyses_use_only_the_public_extension_api():
    """A built-in analysis takes from ``headscope.extend`` only what a plugin can: no name that starts
    with an underscore, and no private module."""
    problems = []
    for path in sorted((PACKAGE / "analyses").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headscope.extend"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    where = path.relative_to(SRC.parent)
                    problems.append(f"{where}:{node.lineno}: {node.module} {private}")
    assert not problems, "analyses importing private names of headscope.extend:\n" + "\n".join(problems)
