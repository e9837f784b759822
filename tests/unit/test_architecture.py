"""Architecture rules: which package may import which, and where torch may load.

Between distributions:
- `psyche_common` imports neither `psyche_server` nor `psyche_client`;
- `psyche_server` does not import `psyche_client`;
- importing every `psyche_common` and `psyche_server` module loads neither torch nor
  transformers (the coordinator server must start on a machine without them).

Inside the client and common packages (docs/architecture.md, "Layers"), over every import a
module makes (top level, function-local and type-only alike):
- no package-level import loop: each folder is a node, and so is each module that sits
  directly in a distribution's root package (`psyche_client/cli.py`);
- no module-level import loop in any of the three packages (`from package import name` counts
  as importing the submodule `name` when there is one, else the package);
- the client's layers: distro < verify < training < round (a lower layer never imports a
  higher one; `verify` is tensor math the training backend calls, so it sits below it); `p2p` and `session` import neither `training` nor `round`; only `cli` and `tui`
  import `app`;
- importing every module of `psyche_client.round` and `psyche_client.p2p` loads no torch;
- only `psyche_client.app` imports `psyche_client.metrics` (the sink is built there and handed
  down; nothing below the app reports metrics itself);
- coordinator purity: the modules of `psyche_common.coordinator` import no I/O (sockets,
  asyncio, HTTP, processes, files), no cryptography (nor `psyche_common.protocol`, whose package
  loads the handshake and the secure channel) and no torch; no `psyche_common` module they reach
  imports networking, asyncio, cryptography or torch; and importing the coordinator in a fresh
  interpreter loads neither `cryptography` nor `asyncio`.

The local testnet only starts processes: `psyche_local_testnet` imports nothing of
`psyche_server` or `psyche_client` (it runs them as programs and reads what they print and
log), and of `psyche_common` only what it needs to build their command lines
(`TESTNET_COMMON`).

Between the benches and the tests: nothing under `bench/` imports `tests` (the tests may import
the benches' harnesses, studies and run configs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import psyche_client
import psyche_common
import psyche_local_testnet
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

METRICS_IMPORTERS = ("app",)
"""The only part of the client that may import `psyche_client.metrics`."""

PACKAGES = (psyche_common, psyche_server, psyche_client)

BENCH = Path(__file__).resolve().parents[2] / "bench"
"""The benches and what they run (`bench/harness`, `bench/study`, `bench/support`)."""

TESTNET_COMMON = (
    "psyche_common.flag_table",  # its `start` command's option table
    "psyche_common.protocol",  # `Identity`: the keys it derives for the server and clients
)
"""What `psyche_local_testnet` may import of `psyche_common` (and of our packages at all)."""

COORDINATOR = "psyche_common.coordinator"

UNREACHABLE_FROM_COORDINATOR = (
    "asyncio",
    "socket",
    "ssl",
    "selectors",
    "http",
    "httpx",
    "urllib",
    "subprocess",
    "cryptography",
    "torch",
    "transformers",
    "psyche_common.protocol",
)
"""Imported by no module the coordinator reaches: networking, asyncio, processes, crypto (the
`psyche_common.protocol` package loads the handshake and the secure channel), torch."""

NOT_IN_COORDINATOR = (*UNREACHABLE_FROM_COORDINATOR, "os", "io", "pathlib", "shutil", "tempfile")
"""Imported by no module of the coordinator package itself: the above, and files."""


def _imports(path: Path) -> Iterator[tuple[str, list[str] | None]]:
    """Each import of the file as (absolute module, the names imported from it), with None
    for `import module`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names]


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module name an `import` or `from ... import` in the file names (the
    names imported from a module too, since they may be submodules)."""
    names: set[str] = set()
    for module, imported in _imports(path):
        names.add(module)
        names.update(f"{module}.{name}" for name in imported or ())
    return names


def _module_name(path: Path) -> str:
    roots = (*PACKAGES, psyche_local_testnet)
    bases = [Path(root.__file__).parent.parent / root.__name__ for root in roots]
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


def _longest_module(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest of `a.b.c`, `a.b`, `a` (for `name` "a.b.c") that is one of `modules`."""
    parts = name.split(".")
    return next(
        (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
        None,
    )


def _package_graph(package: object) -> dict[str, dict[str, set[str]]]:
    """node -> imported node -> the module-level edges that make it (`a -> b`)."""
    root = package.__name__  # type: ignore[attr-defined]
    modules = {_module_name(path): path for path in _package_files(package)}
    graph: dict[str, dict[str, set[str]]] = {}
    for module, path in modules.items():
        source = _node(module, modules, root)
        for name in _imported_modules(path):
            target = _longest_module(name, modules)
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
    loops = [_describe(graph, cycle) for cycle in _cycles(graph)]
    assert loops == []


def _all_modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in (psyche_common, psyche_server, psyche_client)
        for path in _package_files(package)
    }


def _module_targets(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that the file imports: `from package import name` names the
    submodule `name` when there is one, else the package; `import a.b.c` the longest of
    `a.b.c`, `a.b`, `a` that is a module."""
    found: set[str | None] = set()
    for module, imported in _imports(path):
        if imported is None:
            found.add(_longest_module(module, modules))
        for name in imported or ():
            submodule = f"{module}.{name}"
            found.add(submodule if submodule in modules else _longest_module(module, modules))
    return {name for name in found if name is not None}


def _module_graph() -> dict[str, dict[str, set[str]]]:
    """module -> imported module -> the edge (`a -> b`), over the three packages."""
    modules = _all_modules()
    graph: dict[str, dict[str, set[str]]] = {}
    for module, path in modules.items():
        for target in _module_targets(path, modules) - {module}:
            graph.setdefault(module, {})[target] = {f"{module} -> {target}"}
    return graph


def test_no_module_level_import_loop() -> None:
    graph = _module_graph()
    assert any(source.startswith(COORDINATOR) for source in graph)  # the walk found them
    loops = [_describe(graph, cycle) for cycle in _cycles(graph)]
    assert loops == []


def _names(imported: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        name
        for name in imported
        if any(name == prefix or name.startswith(prefix + ".") for prefix in forbidden)
    )


def test_the_coordinator_imports_no_io_no_crypto_and_no_torch() -> None:
    coordinator_files = [
        path for path in _package_files(psyche_common) if _module_name(path).startswith(COORDINATOR)
    ]
    assert len(coordinator_files) > 10
    violations = [
        f"{_module_name(path)} imports {name}"
        for path in coordinator_files
        for name in _names(_imported_modules(path), NOT_IN_COORDINATOR)
    ]
    opens = [
        f"{_module_name(path)} calls open()"
        for path in coordinator_files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
    ]
    assert violations + opens == []


def test_nothing_the_coordinator_reaches_imports_networking_crypto_or_torch() -> None:
    """Over the `psyche_common` modules the coordinator's imports reach (and their packages'
    `__init__`, which Python runs first)."""
    modules = _all_modules()
    graph = _module_graph()
    reached: set[str] = set()
    todo = [name for name in modules if name.startswith(COORDINATOR)]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(graph.get(module, {}))
    assert {"psyche_common.config", "psyche_common.announcements"} <= reached
    violations = [
        f"{module} imports {name}"
        for module in sorted(reached)
        for name in _names(_imported_modules(modules[module]), UNREACHABLE_FROM_COORDINATOR)
    ]
    assert violations == []


def test_importing_the_coordinator_loads_no_crypto_and_no_asyncio() -> None:
    """In a fresh interpreter: `cryptography`, `asyncio`, torch and the protocol package (the
    handshake, the secure channel) stay unloaded."""
    code = f"""
import sys
import {COORDINATOR}
import {COORDINATOR}.machine
loaded = [
    name
    for name in ("cryptography", "asyncio", "torch", "psyche_common.protocol")
    if name in sys.modules
]
print(len(sys.modules), *loaded)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count, *loaded = result.stdout.split()
    assert loaded == []
    assert int(count) > 50  # the import really ran


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


def test_only_the_app_imports_the_metrics() -> None:
    violations = sorted(
        f"{source} imports psyche_client.metrics"
        for source, target in _client_imports()
        if target == "metrics" and _top(source) not in METRICS_IMPORTERS
    )
    assert violations == []


def test_the_testnet_imports_only_what_builds_command_lines() -> None:
    ours = ("psyche_common", "psyche_server", "psyche_client")
    imported = {
        f"{_module_name(path)} imports {name}"
        for path in _package_files(psyche_local_testnet)
        for name in _imported_modules(path)
        if name.split(".")[0] in ours
        and not any(name == allowed or name.startswith(f"{allowed}.") for allowed in TESTNET_COMMON)
    }
    assert sorted(imported) == []


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
