"""The attacks of the attack tests and of bench/attacks.py: `Attack` says what each attacker
is (a test-only client program of tests/e2e, a hostile host, an intruder of a permissioned run,
sybils, a man in the middle) and the run's settings; `ATTACKS` names every one.
`attack_run.run_attack` runs them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ATTACK_CLIENTS = Path(__file__).resolve().parents[2] / "tests" / "e2e"
"""Where the attack programs are (test-only clients, run as programs)."""


@dataclass(frozen=True)
class Attack:
    """An attack: `program`, a client script in tests/e2e run by each attacker; `flood`, where
    each attacker is a host that floods the `server` or honest `peer`s with idle connections,
    sends `decode_bomb`s to the server's and the peers' ports, asks the `relay` for pipes
    with many keys, or reports forged weights hashes from keys that never join
    (`hash_forger`); `intruder`, a client of a permissioned run presenting an `unlisted` key,
    an `expired` delegation or a `forged` one (`bad_delegation`: the two alternate); or
    `tamper`, where each attacker alters one honest client's coordinator link in flight.
    `intruder="sybils"` runs `program` as `sybils_per_owner(honest)` delegates of each of
    `malicious` listed keys. `relayed`: the honest clients advertise an address nobody can
    reach, so peers reach them through the relay only; `honest_keys`: the honest clients use
    keys the harness wrote (an attacker program is handed them: `attack_keys.RunKeys`).
    `quantize_1bit`, `verification_percent` and `data_server` (the run's samples come from the
    server's TCP data server) are the run's settings, its clean twin's too."""

    name: str
    description: str
    program: str | None = None
    flood: str | None = None
    intruder: str | None = None
    tamper: bool = False
    relayed: bool = False
    honest_keys: bool = False
    quantize_1bit: bool = True
    verification_percent: int = 25
    data_server: bool = False

    @property
    def setting(self) -> tuple[bool, int, bool]:
        """What a clean twin must share with this attack's runs."""
        return (self.quantize_1bit, self.verification_percent, self.data_server)

    def command(self) -> list[str]:
        if self.program is None:
            raise ValueError(f"{self.name} runs no attacker client")
        return [sys.executable, str(ATTACK_CLIENTS / self.program)]


ATTACKS: dict[str, Attack] = {
    attack.name: attack
    for attack in (
        Attack("signflip", "trainer negating its gradients", program="signflip_client.py"),
        Attack(
            "freerider",
            "trainer re-sending its first result, relabelled, for every later batch",
            program="freerider_client.py",
        ),
        Attack(
            "huge",
            "trainer sending its values x 1e30 (bf16 run, no verifiers)",
            program="huge_client.py",
            quantize_1bit=False,
            verification_percent=0,
        ),
        Attack(
            "lying_witness",
            "witness with all-ones blooms that also accuses every trainer",
            program="lying_client.py",
        ),
        Attack(
            "false_accuser",
            "witness accusing every trainer in every health check",
            program="accuser_client.py",
        ),
        Attack("stalling", "peer that never answers on P2P", program="stalling_client.py"),
        Attack(
            "equivocator",
            "trainer pushing two signed commitments per batch to two halves of the members",
            program="equivocator_client.py",
        ),
        # detection attacks (issue 18 items 5, 6 and 8): copies, lying verifiers, junk blobs
        Attack(
            "copier",
            "trainer re-announcing another trainer's result of the same round as its own",
            program="copier_client.py",
            verification_percent=50,
        ),
        Attack(
            "lying_verifier",
            "verifier reporting every result it checks as failed",
            program="lying_verifier_client.py",
            verification_percent=50,
        ),
        Attack(
            "junk_blob",
            "peer serving junk bytes for its blobs to half of the members",
            program="junk_blob_client.py",
        ),
        Attack(
            "early_flood",
            "member pushing 1200 far-future announcements to each peer after every Finished",
            program="early_flood_client.py",
        ),
        Attack(
            "slow_reader",
            "member holding 64 requests for old blobs open at each peer, reading about 1 MB/s",
            program="slow_reader_client.py",
        ),
        Attack(
            "manifest_liar",
            "member serving other weights in its manifest and parameters (to joiners and to "
            "the Warmup weights checks)",
            program="manifest_liar_client.py",
        ),
        # members who stall their peers (issue 29, findings 5, 8 and 9)
        Attack(
            "frame_bomb",
            "member sending a 1 MiB frame of a million empty arrays on a fresh link to each "
            "peer after every Finished",
            program="frame_bomb_client.py",
        ),
        Attack(
            "finished_flood",
            "member pushing 1200 Finished for the step it just finished, each with another "
            "Merkle root, to each peer after every Finished",
            program="finished_flood_client.py",
        ),
        Attack(
            "slow_first_announcer",
            "trainer serving its blobs a byte every 2 s",
            program="slow_first_announcer_client.py",
        ),
        # adversaries who adapt (issue 29, findings 1 to 4, 6 and 7)
        Attack(
            "selective_cheat",
            "trainer negating its gradients only for the batches that the verifiers' sampling "
            "rule, run on the round's public seed, leaves unchecked",
            program="selective_cheat_client.py",
        ),
        Attack(
            "colluding_passers",
            "sign flippers that, as verifiers, pass each other's results",
            program="colluding_passer_client.py",
        ),
        Attack(
            "sole_liar",
            "verifier accusing exactly the batches no other verifier checks",
            program="sole_liar_client.py",
        ),
        Attack(
            "delegated_sybils",
            "listed key of a permissioned run delegating a key per honest client and one more, "
            "each serving other weights in its manifest (at most 1 delegate per authorizer)",
            program="manifest_liar_client.py",
            intruder="sybils",
        ),
        Attack(
            "replayed_equivocation",
            "member reporting as equivocations pairs of commitments each honest key signed in "
            "another run, in an earlier life of this run, for a closed step or another's batch",
            program="equivocation_replayer_client.py",
            honest_keys=True,
        ),
        Attack(
            "data_squatter",
            "host holding 64 handshaken, silent connections at the data server, again and "
            "again (samples from the data server)",
            flood="data",
            data_server=True,
        ),
        Attack(
            "relay_hog",
            "member dialing one honest member through the relay from 4 addresses, 96 pipes a "
            "burst (all honest clients relayed)",
            program="relay_hog_client.py",
            relayed=True,
        ),
        Attack("flood_server", "300 idle sockets per attacker at the server", flood="server"),
        Attack("flood_peer", "300 idle sockets per attacker at one honest peer", flood="peer"),
        Attack(
            "decode_bomb",
            "host sending nested-array frames at the coordinator port and every peer's P2P port",
            flood="decode_bomb",
        ),
        Attack(
            "relay_exhaustion",
            "host with 16 joined keys dialing every member through the relay (all honest "
            "clients relayed)",
            flood="relay",
        ),
        Attack(
            "hash_forger",
            "host whose 5 keys never join and report a forged weights hash for the next 64 "
            "steps, again and again",
            flood="hash_forger",
        ),
        Attack(
            "unlisted_key",
            "client of a permissioned run whose key is not listed",
            intruder="unlisted",
        ),
        Attack(
            "bad_delegation",
            "client of a permissioned run with an expired or a forged delegation",
            intruder="bad_delegation",
        ),
        Attack(
            "tamper",
            "man in the middle flipping one byte per connection of an honest client's "
            "coordinator link, after the handshake",
            tamper=True,
        ),
    )
}
