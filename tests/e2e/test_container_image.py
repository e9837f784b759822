"""End-to-end: the container image (`make image`, container/build.sh) runs a client that trains
together with two clients on the host against a host server, all with identical weights.

The image is built with podman as root (or reused: a rebuild with unchanged sources takes
seconds from podman's layer cache). The clients read the server's data server, so the one in the
container trains on the same tokens as the host ones (the builtin python-stdlib corpus depends
on the Python build). The container shares the host's network (`--network host`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from bench.harness.client_run import Cluster, finish_in_agreement, free_port, losses, write_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "container" / "build.sh"
IMAGE = "localhost/psyche:latest"  # what `make image` builds: the test reuses it


def _podman_or_skip() -> None:
    """Install podman through the build script's `tools` step if absent; skip when impossible."""
    if os.geteuid() != 0:
        pytest.skip("building and running the image needs root (rootful podman, mmdebstrap)")
    if shutil.which("podman") is not None:
        return
    done = subprocess.run(
        [str(BUILD), "tools"], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0 or shutil.which("podman") is None:
        pytest.skip(f"podman could not be installed: {done.stderr.strip()[-500:]}")


def _build_image() -> None:
    done = subprocess.run(
        [str(BUILD)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        env={**os.environ, "IMAGE": IMAGE},
    )
    assert done.returncode == 0, f"container/build.sh failed:\n{done.stderr[-4000:]}"


def _data_server_config(tmp: Path) -> Path:
    tokens = tmp / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 256, size=64 * 1024, dtype=np.uint16).astype("<u2").tofile(tokens / "part0.bin")
    config = tmp / "data.toml"
    config.write_text(
        f'dir = "{tokens}"\ntoken_size = "TwoBytes"\nseq_len = 32\n'
        f"shuffle_seed = {list(range(32))}\n"
    )
    return config


def test_a_client_in_the_image_trains_with_host_clients_identically(tmp_path: Path) -> None:
    _podman_or_skip()
    _build_image()
    data_port = free_port()
    state = write_state(
        tmp_path / "state.toml",
        total_steps=8,
        data_location=f'{{ Server = "127.0.0.1:{data_port}" }}',
    )
    cluster = Cluster(tmp_path, state)
    container = f"psyche-test-{uuid.uuid4().hex[:12]}"
    in_image = [
        "podman",
        "run",
        "--rm",
        "--name",
        container,
        "--network",
        "host",
        "-e",
        "OMP_NUM_THREADS=1",
        "-e",
        "MKL_NUM_THREADS=1",
        IMAGE,
        "psyche-client",
    ]
    try:
        cluster.start_server("--data-config", str(_data_server_config(tmp_path)))
        clients = [
            cluster.start_client(),
            cluster.start_client(),
            cluster.start_client(program=in_image),
        ]
        common = finish_in_agreement(cluster, clients, min_common=5)
        assert common[-1] >= 7
        assert losses(clients[2]), "the client in the image trained no step"
    finally:
        cluster.stop()
        subprocess.run(
            ["podman", "rm", "--force", "--ignore", "--time", "0", container],
            capture_output=True,
            timeout=60,
            check=False,
        )
