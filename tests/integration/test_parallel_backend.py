"""A 2-rank client (replicated and sharded) against a single-device client on the same batches.

Each case runs `parallel_driver` in a process of its own (rank 0 there, its worker rank started
by it). Tolerance of "2-rank result equals 1-rank result" (docs/client.md): the gradients
differ only by float reassociation (per-rank sums, then the sum over ranks), so the decoded
DisTrO results must choose the same top-k coefficients (at least `INDEX_AGREEMENT` of them;
every case measured so far agrees on all of them), with the same sign wherever both chose a
coefficient, and bf16 values at most one bf16 step apart (`VALUE_TOLERANCE`). Applying the
same results gives bit-identical weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.model_families import short_directory, write_family

pytestmark = pytest.mark.timeout(300)

INDEX_AGREEMENT = 0.999
VALUE_TOLERANCE = 2.0**-7  # one bf16 step, relative
LOSS_TOLERANCE = 1e-6  # relative


def run_driver(repo_root: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.parallel_driver", *args],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_ends_with_single_device_weights(report: dict[str, Any]) -> None:
    """A sharded or replicated run that ends with the single device's weights: the same
    initial hash, bit-identical hashes after every applied step (each a change), results that
    agree closely, and cancel, export, checkpoint and peer loading keeping the weights."""
    parallel, single = report["initial"]
    assert parallel == single
    previous = parallel
    for step in report["steps"]:
        loss_p, loss_s = step["loss"]
        assert abs(loss_p - loss_s) <= 1e-3 * abs(loss_s), step
        assert step["agreement"]["indices"] >= 0.9, step
        hash_p, hash_s = step["hashes"]
        assert hash_p == hash_s != previous, step
        previous = hash_p
    assert report["cancel"] == {
        "returned_none": True,
        "hash_unchanged": True,
        "next_step_trained": True,
    }
    assert report["export_equal"]
    assert report["checkpoint_hash"] == previous  # the checkpoint reloads as the same weights
    assert report["loaded"] == [parallel] * 2


def check_matches_single_device(report: dict[str, Any]) -> None:
    parallel, single = report["initial"]
    assert parallel == single
    previous = parallel
    for step in report["steps"]:
        loss_p, loss_s = step["loss"]
        assert abs(loss_p - loss_s) <= LOSS_TOLERANCE * abs(loss_s)
        agreement = step["agreement"]
        assert agreement["indices"] >= INDEX_AGREEMENT, step
        assert agreement["signs"] == 1.0, step
        assert agreement["values"] <= VALUE_TOLERANCE, step
        assert step["sizes"][0] == step["sizes"][1]  # same layout, same byte count
        hash_p, hash_s = step["hashes"]
        assert hash_p == hash_s  # the same results applied: bit-identical weights
        assert hash_p != previous
        previous = hash_p
    cancel = report["cancel"]
    assert cancel == {"returned_none": True, "hash_unchanged": True, "next_step_trained": True}
    assert report["export_equal"]
    assert report["checkpoint_hash"] == previous
    loaded, fresh = report["loaded"]
    assert loaded == fresh == report["initial"][0]


def test_data_parallel_matches_single_device(repo_root: Path) -> None:
    """2 ranks, 5 samples (shares 3 and 2), micro-batches of 2: the shares' micro-batches are
    not the single device's, yet the results agree within the tolerance. The client idles for
    twice its parallel timeout after loading: heartbeats keep the idle workers waiting."""
    report = run_driver(
        repo_root, "--steps", "3", "--batch", "5", "--mbs", "2", "--timeout", "5", "--idle", "10"
    )
    check_matches_single_device(report)
    assert [step["tokens"] for step in report["steps"]] == [5 * 32, 5 * 32, 1 * 32]


def test_sharded_matches_single_device_and_holds_half_the_model(repo_root: Path) -> None:
    report = run_driver(
        repo_root, "--fsdp", "--steps", "3", "--batch", "5", "--mbs", "2", "--bf16-values"
    )
    check_matches_single_device(report)
    storage = report["storage"]
    total = storage["total"]
    assert storage["shards"] <= 0.55 * total  # rank 0's rows of every parameter
    assert storage["owned_copies"] <= 0.6 * total  # full copies of the parameters it owns


def test_sharded_two_bit_values_match_single_device(repo_root: Path) -> None:
    """`value_format = "2-bit"`: the sharded engine's results carry the run's value kind (it
    once labelled them from `quantize_1bit` alone, as bf16, and no peer could decode them)."""
    report = run_driver(
        repo_root, "--fsdp", "--steps", "3", "--batch", "5", "--mbs", "2", "--value-format", "2-bit"
    )
    check_ends_with_single_device_weights(report)


def test_sharded_bf16_ranks_hold_the_single_devices_weights(repo_root: Path) -> None:
    """`--dtype bf16 --fsdp`: bf16 shards and owner copies, fp32 momentum; the micro-batches
    differ from the single device's, so results agree loosely, but applying the same results
    gives bit-identical bf16 weights, and export, checkpoint and peer loading keep them."""
    report = run_driver(
        repo_root, "--fsdp", "--dtype", "bf16", "--steps", "3", "--batch", "5", "--mbs", "2"
    )
    check_ends_with_single_device_weights(report)


def test_sharded_tied_embeddings_match_single_device(repo_root: Path) -> None:
    """A Llama with tied embeddings (Llama-3.2 style): the sharded mode wraps the input and
    output embeddings as one unit (FSDP2 refuses a parameter shared by two units), so the tie
    survives sharding; it matches a single-device client and writes a checkpoint that reloads
    with the same hash. (The replicated mode holds whole models: nothing differs there.)"""
    with short_directory() as directory:
        model = write_family(directory / "model", "llama-tied")
        report = run_driver(
            repo_root, "--fsdp", "--steps", "2", "--batch", "5", "--mbs", "2", "--model", str(model)
        )
    check_matches_single_device(report)
    assert report["tied"]
