"""Adversaries who adapt (real processes, the tiny real model, one attacker of four): the rows
of bench/attacks.py for issue 29's findings 1 to 4, 6 and 7 (`bench.harness.attack_catalog`),
each checked for what it must not achieve and for what the protocol must do to it:

- `replayed_equivocation`: every proof it sends is refused, for each of the four reasons
  (another run, another round seed, a closed step, a batch the key never had), and nobody
  is convicted;
- `relay_hog`: no burst of 96 dials from 4 addresses gets more than one key's 8 pipes to its
  victim;
- `data_squatter`: the data server closes every connection its keys open;
- `delegated_sybils`: each sybil past its owner's cap (1) is refused at its Join;
- `sole_liar` and `selective_cheat`: no honest client is convicted (whether they lie or cheat
  in a short run is up to the rounds' draws; bench/attacks.py measures them at 30 steps).

In every run the honest clients exit 0 with identical weights hashes and none is dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import RELAY_PAIR_QUOTA, RunOutcome, run_attack, sybils_per_owner

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # the tiny real model, 8-16 steps

REFUSALS = (
    "for run 'e2e-run-previous'",
    "round seed",
    "is closed to equivocation proofs",
    "was not assigned to",
)
"""What the server says of each kind of replayed proof."""


def _honest_unharmed(run: RunOutcome) -> None:
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= 4, run.diagnostics
    assert run.honest_convicted == [], run.honest_convicted
    assert run.honest_dropped == 0, run.diagnostics


def test_replayed_equivocations_are_refused(tmp_path: Path) -> None:
    run = run_attack(tmp_path, ATTACKS["replayed_equivocation"], steps=8)
    _honest_unharmed(run)
    assert run.details["proofs_sent"] > 0, run.diagnostics
    assert run.details["proofs_refused"] == run.details["proofs_sent"], run.details
    assert run.server is not None
    errors = [
        str(line.get("error"))
        for line in run.server.lines()
        if line.get("message_type") == "Equivocation"
    ]
    for reason in REFUSALS:
        assert any(reason in error for error in errors), (reason, errors[:8])
    assert run.attackers_removed == [True]


def test_a_relay_hog_gets_one_keys_share(tmp_path: Path) -> None:
    run = run_attack(tmp_path, ATTACKS["relay_hog"], steps=8)
    _honest_unharmed(run)
    (bursts,) = run.details["bursts"]
    (granted,) = run.details["most_granted_in_a_burst"]
    (refused,) = run.details["refused"]
    assert bursts >= 1 and refused > 0, run.details
    assert granted <= RELAY_PAIR_QUOTA, run.details


def test_a_data_squatter_holds_no_connection(tmp_path: Path) -> None:
    run = run_attack(tmp_path, ATTACKS["data_squatter"], steps=8)
    _honest_unharmed(run)
    opened = run.details["connections_opened"]
    assert opened > 0 and run.details["closed_by_the_data_server"] == opened, run.details


def test_sybils_past_the_cap_are_refused(tmp_path: Path) -> None:
    run = run_attack(tmp_path, ATTACKS["delegated_sybils"], steps=8)
    _honest_unharmed(run)
    assert run.details == {"sybils": sybils_per_owner(3), "refused": sybils_per_owner(3) - 1}


@pytest.mark.parametrize("name", ["sole_liar", "selective_cheat"])
def test_adaptive_verification_attackers_convict_nobody(tmp_path: Path, name: str) -> None:
    run = run_attack(tmp_path, ATTACKS[name], steps=16)
    _honest_unharmed(run)
    print(f"{name}: removed {run.attackers_removed} at {run.removal_steps}")
