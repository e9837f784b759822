"""The data package's import structure: the provider protocol loads no implementation, and no
module of ``psyche_common.data`` imports itself back through others (no import cycle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import psyche_common.data

DATA_DIR = Path(psyche_common.data.__file__).parent
IMPLEMENTATIONS = (
    "builtin",
    "dummy",
    "factory",
    "fetcher",
    "http",
    "http_client",
    "local",
    "preprocessed",
    "server_client",
    "weighted",
)


def _data_imports(path: Path) -> set[str]:
    """Modules of psyche_common.data that the file imports anywhere (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    prefix = "psyche_common.data."
    return {
        name.removeprefix(prefix).split(".")[0]
        for name in names
        if name.startswith(prefix) and (DATA_DIR / f"{name.removeprefix(prefix)}.py").is_file()
    }


def test_importing_the_protocol_loads_no_implementation() -> None:
    code = (
        "import sys\n"
        "import psyche_common.data.provider\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('psyche_common.data.'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = {name.removeprefix("psyche_common.data.") for name in result.stdout.split()}
    assert "provider" in loaded  # the probe really imported the module
    assert loaded.isdisjoint(IMPLEMENTATIONS), sorted(loaded & set(IMPLEMENTATIONS))


def test_the_data_package_has_no_import_cycle() -> None:
    graph = {path.stem: _data_imports(path) for path in DATA_DIR.glob("*.py")}
    assert graph["factory"] >= {"http", "local", "weighted", "server_client"}  # parser works
    assert graph["provider"] == set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        for target in sorted(graph.get(module, ())):
            found = cycle_from(target, [*path, module])
            if found:
                return found
        return None

    cycles = [cycle for module in sorted(graph) if (cycle := cycle_from(module, []))]
    assert cycles == []
