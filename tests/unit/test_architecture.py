"""Architecture rules: which package may import which, and that torch stays out of the server.

- `psyche_common` imports neither `psyche_server` nor `psyche_client`;
- `psyche_server` does not import `psyche_client`;
- importing every `psyche_common` and `psyche_server` module loads neither torch nor
  transformers (the coordinator server must start on a machine without them).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import psyche_common
import psyche_server
import pytest

FORBIDDEN_IMPORTS = {
    "psyche_common": ("psyche_server", "psyche_client"),
    "psyche_server": ("psyche_client",),
}


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module name an `import` or `from ... import` in the file names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", [psyche_common, psyche_server], ids=lambda p: p.__name__)
def test_package_imports_only_what_it_may(package: object) -> None:
    root = Path(package.__file__).parent  # type: ignore[attr-defined]
    forbidden = FORBIDDEN_IMPORTS[package.__name__]  # type: ignore[attr-defined]
    violations = [
        f"{path.relative_to(root.parent)} imports {name}"
        for path in sorted(root.rglob("*.py"))
        for name in sorted(_imported_modules(path))
        if name.split(".")[0] in forbidden
    ]
    assert violations == []


def test_common_and_server_modules_import_without_torch() -> None:
    code = """
import importlib, pkgutil, sys
import psyche_common, psyche_server
modules = [
    info.name
    for package in (psyche_common, psyche_server)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not info.name.endswith(".__main__")
]
for name in modules:
    importlib.import_module(name)
heavy = [name for name in ("torch", "transformers") if name in sys.modules]
print(len(modules), heavy)
sys.exit(1 if heavy else 0)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    module_count = int(result.stdout.split()[0])
    assert module_count > 50  # the walk really found the packages' modules
