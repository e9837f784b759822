"""Architecture rules: which package may import which, and where torch may load.

Between distributions:
- `psyche_common` imports neither `psyche_server` nor `psyche_client`;
- `psyche_server` does not import `psyche_client`;
- importing every `psyche_common` and `psyche_server` module loads neither torch nor
  transformers (the coordinator server must start on a machine without them).

Inside the client and common packages (docs/architecture.md, "Layers"), over every import a
module makes (top level, function-local and type-only alike):
- no package-level import loop: each folder is a node, and so is each module that sits
  directly in a distribution's root package (`psyche_client/cli.py`); the coordinator package
  of `psyche_common` may loop inside itself, nothing else may;
- the client's layers: distro < verify < training < round (a lower layer never imports a
  higher one; `verify` is tensor math the training backend calls, so it sits below it); `p2p` and `session` import neither `training` nor `round`; only `cli` and `tui`
  import `app`;
- importing every module of `psyche_client.round` and `psyche_client.p2p` loads no torch.

Between the benches and the tests: nothing under `bench/` imports `tests` (the tests may import
the benches' harnesses, studies and run configs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psyche_client
import psyche_common
import psyche_server
import pytest

FORBIDDEN_IMPORTS = {
    "psyche_common": ("psyche_server", "psyche_client"),
    "psyche_server": ("psyche_client",),
}

CLIENT_LAYERS = ("distro", "verify", "training", "round")
"""Each may import those before it, never those after it."""

CLIENT_FORBIDDEN = {
    "p2p": ("training", "round"),
    "session": ("training", "round"),
}
"""Client subpackages and the subpackages they may not import."""

APP_IMPORTERS = ("cli", "tui", "app")
"""The only parts of the client that may import `psyche_client.app`."""

PACKAGES = (psyche_common, psyche_server, psyche_client)

BENCH = Path(__file__).resolve().parents[2] / "bench"
"""The benches and what they run (`bench/harness`, `bench/study`, `bench/support`)."""


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module name an `import` or `from ... import` in the file names (the
    names imported from a module too, since they may be submodules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _module_name(path: Path) -> str:
    bases = [Path(root.__file__).parent.parent / root.__name__ for root in PACKAGES]
    for base in [*bases, BENCH]:
        if path.is_relative_to(base):
            parts = path.relative_to(base.parent).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def _package_files(package: object) -> Iterator[Path]:
    yield from sorted(Path(package.__file__).parent.rglob("*.py"))  # type: ignore[attr-defined]


def _node(module: str, modules: dict[str, Path], root: str) -> str:
    """The node of the package graph a module belongs to: its folder, or itself when it sits
    directly in the root package."""
    path = modules[module]
    if path.name == "__init__.py":
        return module
    folder = module.rsplit(".", 1)[0]
    return module if folder == root else folder


def _package_graph(package: object) -> dict[str, dict[str, set[str]]]:
    """node -> imported node -> the module-level edges that make it (`a -> b`)."""
    root = package.__name__  # type: ignore[attr-defined]
    modules = {_module_name(path): path for path in _package_files(package)}
    graph: dict[str, dict[str, set[str]]] = {}
    for module, path in modules.items():
        source = _node(module, modules, root)
        for name in _imported_modules(path):
            parts = name.split(".")
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
            target_node = _node(target, modules, root)
            if target_node != source and target_node != root:
                graph.setdefault(source, {}).setdefault(target_node, set()).add(
                    f"{module} -> {target}"
                )
    return graph


def _cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    nodes = set(graph) | {target for targets in graph.values() for target in targets}
    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def _describe(graph: dict[str, dict[str, set[str]]], cycle: list[str]) -> list[str]:
    return [
        edge
        for source in cycle
        for target in cycle
        for edge in sorted(graph.get(source, {}).get(target, set()))
    ]


@pytest.mark.parametrize("package", [psyche_common, psyche_server], ids=lambda p: p.__name__)
def test_package_imports_only_what_it_may(package: object) -> None:
    forbidden = FORBIDDEN_IMPORTS[package.__name__]  # type: ignore[attr-defined]
    violations = [
        f"{_module_name(path)} imports {name}"
        for path in _package_files(package)
        for name in sorted(_imported_modules(path))
        if name.split(".")[0] in forbidden
    ]
    assert violations == []


@pytest.mark.parametrize("package", [psyche_common, psyche_client], ids=lambda p: p.__name__)
def test_no_package_level_import_loop(package: object) -> None:
    graph = _package_graph(package)
    allowed = {"psyche_common.coordinator"}  # may loop inside itself: it is one node already
    loops = [_describe(graph, cycle) for cycle in _cycles(graph) if not set(cycle) <= allowed]
    assert loops == []


def _client_imports() -> Iterator[tuple[str, str]]:
    """(importing subpackage or module, imported subpackage or module) of `psyche_client`,
    each the first name below `psyche_client`."""
    for path in _package_files(psyche_client):
        source = _module_name(path).split(".")
        if len(source) < 2:
            continue
        for name in _imported_modules(path):
            target = name.split(".")
            if target[0] == "psyche_client" and len(target) > 1 and target[1] != source[1]:
                yield ".".join(source), target[1]


def _top(module: str) -> str:
    return module.split(".")[1]


def test_client_layers_import_only_downwards() -> None:
    violations = sorted(
        f"{source} imports psyche_client.{target}"
        for source, target in _client_imports()
        if _top(source) in CLIENT_LAYERS
        and target in CLIENT_LAYERS
        and CLIENT_LAYERS.index(target) > CLIENT_LAYERS.index(_top(source))
    )
    assert violations == []


def test_p2p_and_session_import_neither_training_nor_round() -> None:
    violations = sorted(
        f"{source} imports psyche_client.{target}"
        for source, target in _client_imports()
        if target in CLIENT_FORBIDDEN.get(_top(source), ())
    )
    assert violations == []


def test_only_the_cli_and_the_dashboard_import_the_app() -> None:
    violations = sorted(
        f"{source} imports psyche_client.app"
        for source, target in _client_imports()
        if target == "app" and _top(source) not in APP_IMPORTERS
    )
    assert violations == []


def _heavy_modules_after_importing(packages: list[str]) -> tuple[int, list[str], str]:
    """(modules imported, heavy libraries then loaded, stderr) for every module under the
    named packages, imported in a fresh interpreter."""
    code = f"""
import importlib, pkgutil, sys
count = 0
for package_name in {packages!r}:
    package = importlib.import_module(package_name)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
            count += 1
heavy = [name for name in ("torch", "transformers") if name in sys.modules]
print(count, *heavy)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count, *heavy = result.stdout.split()
    return int(count), heavy, result.stderr


def test_common_and_server_modules_import_without_torch() -> None:
    count, heavy, _ = _heavy_modules_after_importing(["psyche_common", "psyche_server"])
    assert heavy == []
    assert count > 50  # the walk really found the packages' modules


def test_the_round_pipeline_and_p2p_import_without_torch() -> None:
    count, heavy, _ = _heavy_modules_after_importing(["psyche_client.round", "psyche_client.p2p"])
    assert heavy == []
    assert count > 30


def test_bench_imports_nothing_from_tests() -> None:
    files = sorted(BENCH.rglob("*.py"))
    violations = [
        f"{_module_name(path)} imports {name}"
        for path in files
        for name in sorted(_imported_modules(path))
        if name.split(".")[0] == "tests"
    ]
    assert violations == []
    assert len(files) > 20  # the walk really found the benches and their packages
