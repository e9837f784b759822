"""Shared pytest fixtures: paths to the reference fixtures in ../shared (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "psyche"


@pytest.fixture
def shared_fixtures() -> Path:
    """The reference implementation's fixtures; skips the test when ../shared is absent."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"reference fixtures not found at {SHARED_FIXTURES} (../shared is absent)")
    return SHARED_FIXTURES


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
