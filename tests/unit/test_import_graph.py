"""No import loop between the parts of a package.

A part is a module directly in the package's root folder or a subpackage (a folder, with
everything below it); a loop between modules inside one subpackage (the coordinator's state
and its transition modules, for example) is that subpackage's own business. Every import
counts: top-level, function-local and those under `TYPE_CHECKING`, since a loop hidden behind
a local import is still a loop in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import psyche_common
import pytest


def _modules(package: ModuleType) -> dict[str, Path]:
    """Dotted module name → file, for every module of `package` (a package by its own name)."""
    root = Path(package.__file__).parent  # type: ignore[arg-type]
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _part_of(module: str, modules: dict[str, Path], root: str) -> str:
    """The part `module` belongs to: itself at the root level, else its top subpackage."""
    parts = module.split(".")
    if len(parts) == 2 and modules[module].name != "__init__.py":
        return module
    return ".".join(parts[:2]) if len(parts) >= 2 else root


def _imported(module: str, path: Path) -> set[str]:
    """Every absolute module name (and `module.name` candidate) the file imports."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def part_graph(package: ModuleType) -> dict[str, dict[str, list[str]]]:
    """part → imported part → the `module -> module` imports that make the edge."""
    modules = _modules(package)
    root = package.__name__
    edges: dict[str, dict[str, list[str]]] = {}
    for module, path in modules.items():
        source = _part_of(module, modules, root)
        for name in _imported(module, path):
            parts = name.split(".")
            # the longest prefix that is one of the package's modules
            target = next(
                (
                    ".".join(parts[:i])
                    for i in range(len(parts), 0, -1)
                    if ".".join(parts[:i]) in modules
                ),
                None,
            )
            if target is None:
                continue
            target_part = _part_of(target, modules, root)
            if target_part not in (source, root):
                edges.setdefault(source, {}).setdefault(target_part, []).append(
                    f"{module} -> {target}"
                )
    return edges


def loops(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
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
                found.append(sorted(component))

    nodes = set(edges) | {b for targets in edges.values() for b in targets}
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", [psyche_common], ids=lambda p: p.__name__)
def test_no_import_loop_between_parts(package: ModuleType) -> None:
    edges = part_graph(package)
    found = loops(edges)
    why = [
        f"{a} -> {b}: {sorted(edges[a][b])[:4]}"
        for component in found
        for a in component
        for b in component
        if b in edges.get(a, {})
    ]
    assert found == [], "\n".join(why)


def test_function_local_and_type_only_imports_count(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.a import A\n"
        "def f() -> None:\n"
        "    from pkg.b import B\n"
        "    from . import c\n"
    )
    imported = _imported("pkg.sub.example", source)
    assert {"pkg.a", "pkg.b", "pkg.sub.c"} <= imported


def test_root_modules_and_subpackages_are_parts() -> None:
    edges = part_graph(psyche_common)
    assert "psyche_common.config" in edges["psyche_common.coordinator"]
    assert "psyche_common.batch_id" in edges["psyche_common.data"]
