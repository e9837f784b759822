"""The `netlab` pytest fixture: a fresh `Lab` per test, torn down whatever happens; the test
is skipped, with the reason, only where network namespaces cannot be made on this machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.harness.netlab.lab import Lab
from bench.harness.netlab.shell import remove_stale, unavailable_reason


@pytest.fixture(scope="session")
def netlab_available() -> None:
    """Skips when no lab can be built; otherwise removes namespaces left by crashed labs."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network lab unavailable: {reason}")
    remove_stale()


@pytest.fixture
def netlab(netlab_available: None) -> Iterator[Lab]:
    """A `Lab` with its switch built; everything it made is removed after the test."""
    with Lab() as lab:
        yield lab
