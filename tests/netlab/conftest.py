"""Fixtures of the network-lab tests (see tests/netlab/fixtures.py)."""

from tests.netlab.fixtures import netlab, netlab_available

__all__ = ["netlab", "netlab_available"]
