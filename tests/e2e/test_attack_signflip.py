"""Verification against a sign-flip trainer (real processes, the tiny real model).

Four clients train `builtin:llama-tiny` with `verification_percent = 25` (one verifier and
three trainers a round); one of them is tests/e2e/signflip_client.py, which negates its
gradients. A verifier that samples one of its batches recomputes it at the point the trainer
trained at (its lookahead along its own published result of the step before:
`distro.lookahead`), finds its result's signs opposite to the recomputed gradient's and
reports it; once two verifiers have each done so at two different steps, the coordinator
convicts it and drops it from the epoch. The honest clients' weights hashes stay identical at
every applied step, no honest client is convicted, and from the conviction's step on no
honest client applies a result of the attacker.

At 25 % this test once failed: the lookahead moved along the trainer's private momentum,
which a verifier cannot recompute, and the flipper's agreement with a gradient recomputed at
the round's weights rose over the epoch (0.0 in its first rounds, above the accusation
threshold after a few), so it was sometimes never convicted (docs/verification.md).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from psyche_client.verify.threshold import ACCUSE_BELOW

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import run_attack
from bench.harness.client_run import Cluster, Proc, applied_hashes, wait_for, write_state
from tests.e2e.conftest import CleanRun

pytestmark = pytest.mark.timeout(900)

LOSS_TOLERANCE = 0.05

SIGNFLIP = [sys.executable, str(Path(__file__).with_name("signflip_client.py"))]


def client_short_id(proc: Proc) -> str:
    ids = {line["client_id"] for line in proc.lines() if "client_id" in line}
    assert len(ids) == 1, f"{proc.name}: client ids {ids}"
    return ids.pop()


def convictions(server: Proc) -> list[dict]:
    return [line for line in server.lines() if str(line.get("msg", "")).startswith("conviction:")]


def test_a_sign_flip_trainer_is_convicted_and_its_results_are_not_applied(
    tmp_path: Path,
) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=24,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=2,
        verification_percent=25,
        batch=6,
    )
    c = Cluster(tmp_path, state)
    try:
        server = c.start_server()
        honest = [c.start_client() for _ in range(3)]
        attacker = c.start_client(program=SIGNFLIP)
        wait_for(lambda: convictions(server), 300, "a conviction", c.diagnostics)
        wait_for(
            lambda: all(p.popen.poll() is not None for p in honest),
            300,
            "the honest clients to finish the run",
            c.diagnostics,
        )
        assert [p.popen.returncode for p in honest] == [0, 0, 0], c.diagnostics()
        bad = client_short_id(attacker)
        found = convictions(server)
        assert {line["client"] for line in found} == {bad}, found
        convicted_step = min(line["convicted_step"] for line in found)
        tables = [applied_hashes(p) for p in honest]
        common = sorted(set.intersection(*(set(t) for t in tables)))
        assert len(common) >= 10, f"only {len(common)} common applied steps"
        for step in common:
            assert len({t[step] for t in tables}) == 1, f"honest weights differ at step {step}"
        for proc in honest:
            after = [
                e for e in proc.events("applied step") if e["applied_from_step"] >= convicted_step
            ]
            assert after, f"{proc.name}: nothing applied after the conviction"
            assert all(bad not in e["senders"] for e in after), after
            assert all(e["results"] >= 1 for e in after), after
        scored = [line for p in [*honest, attacker] for line in p.events("verifier scored")]
        honest_scores = [s["agreement"] for s in scored if s["trainer"] != bad]
        attacker_scores = [s["agreement"] for s in scored if s["trainer"] == bad]
        assert attacker_scores and max(attacker_scores) < ACCUSE_BELOW, attacker_scores
        assert all(score >= ACCUSE_BELOW for score in honest_scores), honest_scores
        print(f"agreement: honest {sorted(honest_scores)} attacker {sorted(attacker_scores)}")
    finally:
        c.stop()


def test_honest_clients_with_verifiers_are_never_convicted(tmp_path: Path) -> None:
    """Four honest clients at 25%: every round one of them verifies 2 of the 3 batches; no
    result scores below the threshold, nobody is accused, and the weights hashes agree."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=14,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=2,
        verification_percent=25,
        batch=6,
    )
    c = Cluster(tmp_path, state)
    try:
        server = c.start_server()
        clients = [c.start_client() for _ in range(4)]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            300,
            "the clients to finish the run",
            c.diagnostics,
        )
        assert [p.popen.returncode for p in clients] == [0, 0, 0, 0], c.diagnostics()
        assert convictions(server) == []
        assert not [
            line
            for p in clients
            for line in p.events("verifier scored")
            if line["agreement"] < ACCUSE_BELOW
        ]
        scored = [line["agreement"] for p in clients for line in p.events("verifier scored")]
        assert len(scored) >= 10, scored  # verification ran in most rounds
        tables = [applied_hashes(p) for p in clients]
        common = sorted(set.intersection(*(set(t) for t in tables)))
        assert len(common) >= 9, f"only {len(common)} common applied steps"
        for step in common:
            assert len({t[step] for t in tables}) == 1, f"weights differ at step {step}"
        print(f"honest agreement: min {min(scored):.3f}, {len(scored)} scores")
    finally:
        c.stop()


SIGNFLIP_LOSS_STEPS = 24
"""Steps of the loss comparison. A conviction needs two verifiers that each accused at two
different steps (docs/verification.md): at 50 % of four clients (two verifiers a round,
drawn from three honest members) it came at step 3 to 8, and the flipped results before it
are applied. Over 8 steps they cost 1.3 to 5.4 % of the loss (one run 1.0535, which failed),
over 16 up to 4.7 %, so the comparison runs three times as long as the other attack tests."""


@pytest.mark.slow  # a clean run and an attacked one
def test_a_sign_flip_trainer_costs_less_than_5_percent_of_the_loss(
    tmp_path: Path, clean_run: CleanRun
) -> None:
    """The sign-flipper among four clients at 50% verification, against a clean run of the
    same settings (bench/harness/attack_run.py): it is removed, the honest weights agree at every
    step, and the held-out loss after the run is within 5% of the clean run's. A conviction
    needs accusations from two different verifiers (docs/verification.md); at 25% four clients
    have one verifier a round, too few to be sure of two within this short run."""
    attack = dataclasses.replace(ATTACKS["signflip"], verification_percent=50)
    steps = SIGNFLIP_LOSS_STEPS
    clean = clean_run(attack.quantize_1bit, attack.verification_percent, steps)
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=steps)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= steps - 4, run.diagnostics
    assert run.attackers_removed == [True], run.diagnostics
    assert clean.eval_loss is not None and run.eval_loss is not None
    ratio = run.eval_loss / clean.eval_loss
    print(f"eval loss: clean {clean.eval_loss:.4f}, attacked {run.eval_loss:.4f} ({ratio:.4f})")
    assert abs(ratio - 1.0) <= LOSS_TOLERANCE, (clean.eval_loss, run.eval_loss)
