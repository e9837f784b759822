"""End-to-end: Psyche's `llama2-20m-dolma-noverify-no-checkpointer` config and its data.toml,
as the reference ships them, start and train with real processes. Only the model location
changes (there is no Hub here: a small Llama directory is built with transformers). The
layout is the reference's: the coordinator on 20000 and the data server on 20001, which the
relay (sharing the coordinator port) no longer collides with. The data is the dolma token
file repeated to hold two steps' worth of samples, its token ids folded into the small
model's vocabulary (`VOCAB`: a step of 8 x 2048 tokens then takes seconds on a shared CPU
instead of more than the config's 30 s round), so the run also shows that data which runs
out ends the run cleanly: the server ends it before a round would read past the data, and
both clients exit with status 0.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.harness.client_run import Cluster, applied_hashes, wait_for

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]  # about 70 s: the config's own
# waits (3 s for members, a 10 s cooldown) and two real steps of 8 x 2048 tokens

CONFIG = "llama2-20m-dolma-noverify-no-checkpointer"
COORDINATOR_PORT = 20000  # the reference's layout: its data.toml's server is on 20001
SEQ_LEN = 2048
BATCH = 8
STEPS_OF_DATA = 2
VOCAB = 512


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: the model's location is a checkpoint `repo_id` (at
    most 64 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="psy"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_model(directory: Path) -> None:
    """A small untied Llama with a `VOCAB`-token vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)


def test_the_shipped_dolma_config_trains_until_its_data_runs_out(
    shared_fixtures: Path, tmp_path: Path, short_dir: Path
) -> None:
    if not (_port_free(COORDINATOR_PORT) and _port_free(COORDINATOR_PORT + 1)):
        pytest.skip(
            f"ports {COORDINATOR_PORT}/{COORDINATOR_PORT + 1} of the shipped layout are in use"
        )
    shipped = shared_fixtures / "configs" / CONFIG
    configs = tmp_path / "configs" / CONFIG
    configs.mkdir(parents=True)
    shutil.copy(shipped / "data.toml", configs / "data.toml")  # unchanged
    model = short_dir / "model"
    build_model(model)
    state_text = (shipped / "state.toml").read_text()
    assert 'repo_id = "emozilla/llama2-20m-init"' in state_text
    (configs / "state.toml").write_text(
        state_text.replace('"emozilla/llama2-20m-init"', f'"{model}"')
    )
    # data.toml's dir, "../../data/dolma", from the config folder: the dolma token file,
    # repeated to hold STEPS_OF_DATA steps of 8 samples of 2048 tokens
    dolma = shared_fixtures / "data" / "dolma" / "data"
    tokens = np.fromfile(next(dolma.glob("*.npy")), dtype="<u2") % VOCAB
    needed = STEPS_OF_DATA * BATCH * SEQ_LEN
    data_dir = tmp_path / "data" / "dolma"
    data_dir.mkdir(parents=True)
    np.resize(tokens, needed).astype("<u2").tofile(data_dir / "dolma-nanoset.npy")

    cluster = Cluster(tmp_path, configs / "state.toml", port=COORDINATOR_PORT)
    try:
        server = cluster.start_server(
            "--data-config", str(configs / "data.toml"), "--init-warmup-time", "10"
        )
        clients = [
            cluster.start_client("--micro-batch-size", "1", run_id="llama2-20m-dolma")
            for _ in range(2)
        ]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            300,
            "both clients to finish the run",
            cluster.diagnostics,
        )
        assert [p.popen.returncode for p in clients] == [0, 0], cluster.diagnostics()
        tables = [applied_hashes(p) for p in clients]
        trained = {e["step"] for p in clients for e in p.events("trained step") if e["batches"]}
        assert trained == set(range(1, STEPS_OF_DATA + 1)), cluster.diagnostics()
        common = sorted(set(tables[0]) & set(tables[1]))
        assert all(tables[0][s] == tables[1][s] for s in common), tables
        shared = [p.events("model shared for late joiners")[-1]["weights_hash"] for p in clients]
        assert shared[0] == shared[1], shared  # the same weights at the end of the run
        server_log = server.log_path.read_text()
        assert "the training data runs out" in server_log
        assert "OutOfRange" not in server_log and "address already in use" not in server_log
        for proc in clients:
            assert proc.events("run finished; exiting"), proc.tail()
            assert not proc.events("round without training"), proc.tail()
    finally:
        cluster.stop()
