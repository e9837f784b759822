"""End-to-end: a model with tied embeddings trained by real processes.

A `psyche-server` and two `psyche-client` processes train a tiny Qwen2 whose input and output
embeddings are one tensor (as Qwen2.5-0.5B and 1.5B ship), from a local model directory the
test writes, under `architecture = "HfAuto"`: both clients apply every common step to the
same weights hash, and the checkpoint written at the end reloads in transformers tied, with
the final weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, applied_hashes, wait_for, write_state
from tests.support.model_families import short_directory, write_family

pytestmark = pytest.mark.timeout(400)


def test_two_clients_train_a_tied_qwen2_with_identical_hashes(tmp_path: Path) -> None:
    with short_directory() as directory:
        model = write_family(directory / "qwen2", "qwen2-tied")
        state = write_state(
            tmp_path / "state.toml",
            architecture="HfAuto",
            model=str(model),
            total_steps=6,
            init_min_clients=2,
            min_clients=2,
            batch=4,
            warmup_time=30,
        )
        c = Cluster(tmp_path, state)
        try:
            c.start_server()
            checkpoints = tmp_path / "checkpoints"
            clients = [c.start_client("--checkpoint-dir", str(checkpoints)), c.start_client()]
            wait_for(
                lambda: all(p.popen.poll() is not None for p in clients),
                300,
                "both clients to finish the run",
                c.diagnostics,
            )
        finally:
            c.stop()
    assert [p.popen.returncode for p in clients] == [0, 0], c.diagnostics()
    tables = [applied_hashes(p) for p in clients]
    common = sorted(set(tables[0]) & set(tables[1]))
    assert len(common) >= 3, c.diagnostics()  # steps 3-5 apply the results of 1-3
    for step in common:
        assert tables[0][step] == tables[1][step], f"weights differ at step {step}"
    assert len({tables[0][step] for step in common}) == len(common)  # every step changed them

    from psyche_client.training.trainer import weights_digest
    from transformers import AutoModelForCausalLM

    saved = sorted(checkpoints.glob("e2e-run-step*"))
    assert saved, f"no checkpoint in {checkpoints}"
    reloaded = AutoModelForCausalLM.from_pretrained(saved[-1])
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    assert weights_digest(reloaded).hex() == tables[0][common[-1]]
