"""One attacked (or clean) training run of real processes, measured the same way for the
attack tests and for bench/attacks.py.

A run is a `psyche-server` and `clients` processes training `builtin:llama-tiny` on CPU for
`steps` steps (global batch max(6, clients) × 32 tokens); `malicious` of them are attackers:
a test-only client program of tests/e2e (one behaviour changed); or, for the floods, hosts
that hold idle sockets against the server or against honest clients' P2P ports, send decode
bombs at the server's and the clients' ports, or ask the relay for pipes with many keys while
the honest clients reach each other only through it (`hostile_hosts`); or, for the intruders,
clients of a permissioned run (`--authorized-keys` lists the honest clients' keys) whose key is
not listed, or whose delegation expired or is forged. Flooding hosts and intruders are no
members: only the honest clients are. Or, for `tamper`, a man in the middle: `malicious` of
the (all honest) clients reach the server through a proxy that flips one byte of their `Join`
and then one of a state on their next connection (`bench.harness.tamper_proxy`). The first
honest client writes a checkpoint at the end; its loss on a fixed held-out slice of the
training corpus (`eval_loss`) is what "loss vs clean" compares, so the attacked run and its
clean twin are judged on the same tokens whatever batches each trainer happened to get.

`run_attack` never asserts: it returns a `RunOutcome` (exit codes, whether the honest weights
hashes agree at every common applied step, the evaluation loss, whether every honest
training loss was finite, whether each attacker was removed) for the caller to judge.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from psyche_common.protocol import Identity, coordinator_domain
from psyche_common.protocol.authorization import encode_authorization, sign_authorization

from bench.harness.client_run import (
    Cluster,
    Proc,
    applied_hashes,
    free_port,
    losses,
    wait_for,
    write_state,
)
from bench.harness.flood import Flood
from bench.harness.hostile_hosts import DecodeBomber, HashForger, RelayExhauster
from bench.harness.tamper_proxy import DOWN, UP, Flip, TamperProxy

Host = Flood | DecodeBomber | RelayExhauster | HashForger

ATTACK_CLIENTS = Path(__file__).resolve().parents[2] / "tests" / "e2e"
"""Where the attack programs are (test-only clients, run as programs)."""
EVAL_SEQUENCES = 64
EVAL_SEQ_LEN = 32
FLOOD_SOCKETS = 300
DROPPED_LINE = "dropped from the epoch by a health check: joining again for the next epoch"
REFUSED_LINE = "server rejected this client: not authorized"
TAMPER_FLIPS = (Flip(0, UP, 1), Flip(1, DOWN, 3))
"""A tampering proxy's flips: the first connection's Join (client → server), then the fourth
frame the server sends on the second connection (a state or the reachability notice)."""
AUTHENTICATION_FAILED = "failed authentication"


@dataclass(frozen=True)
class Attack:
    """An attack: `program`, a client script in tests/e2e run by each attacker; `flood`, where
    each attacker is a host that floods the `server` or honest `peer`s with idle connections,
    sends `decode_bomb`s to the server's and the peers' ports, asks the `relay` for pipes
    with many keys, or reports forged weights hashes from keys that never join
    (`hash_forger`); `intruder`, a client of a permissioned run presenting an `unlisted` key,
    an `expired` delegation or a `forged` one (`bad_delegation`: the two alternate); or
    `tamper`, where each attacker alters one honest client's coordinator link in flight.
    `quantize_1bit` and `verification_percent` are the run's settings (its clean twin's too)."""

    name: str
    description: str
    program: str | None = None
    flood: str | None = None
    intruder: str | None = None
    tamper: bool = False
    quantize_1bit: bool = True
    verification_percent: int = 25

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


@dataclass
class RunOutcome:
    attack: str
    clients: int
    malicious: int
    steps: int
    seconds: float
    honest_exit_codes: list[int | None]
    common_steps: list[int]
    hashes_agree: bool
    losses_finite: bool
    eval_loss: float | None
    attackers_removed: list[bool]
    honest: list[Proc] = field(repr=False)
    attackers: list[Proc] = field(repr=False)
    server: Proc | None = field(repr=False)
    floods: list[Host] = field(repr=False)
    diagnostics: str = field(repr=False)
    removal_steps: list[int | None] = field(default_factory=list)
    """Per attacker, the step at which it was convicted or dropped (None: not removed)."""
    honest_convicted: list[str] = field(default_factory=list)
    """Honest clients the coordinator convicted (false convictions)."""
    honest_dropped: int = 0
    """Honest clients dropped from the epoch by a health check or a false report."""

    @property
    def honest_ok(self) -> bool:
        return self.honest_exit_codes == [0] * len(self.honest_exit_codes)


def eval_tokens(cache_dir: Path) -> np.ndarray:
    """`EVAL_SEQUENCES` sequences of `EVAL_SEQ_LEN + 1` tokens spread over the last 5% of the
    `python-stdlib` corpus (a short run trains on its first batches only)."""
    from psyche_common.data.builtin import python_stdlib_tokens

    corpus = np.asarray(python_stdlib_tokens(cache_dir), dtype=np.int64)
    start = int(len(corpus) * 0.95)
    stride = (len(corpus) - start - EVAL_SEQ_LEN - 1) // EVAL_SEQUENCES
    return np.stack(
        [
            corpus[start + i * stride : start + i * stride + EVAL_SEQ_LEN + 1]
            for i in range(EVAL_SEQUENCES)
        ]
    )


def model_loss(model: Any, cache_dir: Path) -> float:
    """Mean next-token cross-entropy of a causal LM on `eval_tokens`."""
    import torch

    model.eval()
    tokens = torch.from_numpy(eval_tokens(cache_dir))
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
    return float(loss)


def eval_loss(checkpoints: Path, cache_dir: Path) -> float | None:
    """`model_loss` of the newest checkpoint under `checkpoints`; None when no checkpoint
    was written."""
    saved = sorted(checkpoints.glob("*-step*"), key=lambda p: int(p.name.rsplit("step", 1)[1]))
    if not saved:
        return None
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(saved[-1], dtype=torch.float32)
    return model_loss(model, cache_dir)


def untrained_loss(cache_dir: Path) -> float:
    """`model_loss` of `builtin:llama-tiny` as every client builds it before training (the
    same seed), to tell how far a run's training moved the loss."""
    import torch
    from psyche_client.training.distro_backend import RNG_SEED
    from psyche_client.training.model.loading import load_model

    torch.manual_seed(RNG_SEED)
    model, _ = load_model("builtin:llama-tiny", device="cpu", dtype=torch.float32)
    return model_loss(model, cache_dir)


def client_id(proc: Proc) -> str | None:
    """The short client id a client process logs (None before it logged one)."""
    for line in proc.lines():
        if "client_id" in line:
            return str(line["client_id"])
    return None


def convicted_ids(server: Proc) -> set[str]:
    """Clients the server convicted or removed for a proven equivocation."""
    return {
        str(line["client"])
        for line in server.lines()
        if str(line.get("msg", "")).startswith(("conviction:", "equivocation:"))
        and "client" in line
    }


def removal_step(server: Proc | None, attacker: Proc) -> int | None:
    """The first step at which `attacker` was convicted (the server's record) or dropped by a
    health check (its own log line); None when neither happened."""
    me = client_id(attacker)
    steps = [
        int(line["convicted_step"])
        for line in (server.lines() if server is not None else [])
        if str(line.get("msg", "")).startswith("conviction:")
        and line.get("client") == me
        and "convicted_step" in line
    ]
    steps += [int(line["step"]) for line in attacker.events(DROPPED_LINE) if "step" in line]
    if not steps and server is not None and me in convicted_ids(server):
        steps = [0]  # an equivocation line names no step: removed, step unknown
    return min(steps) if steps else None


def run_attack(
    tmp: Path,
    attack: Attack | None,
    *,
    clients: int = 4,
    malicious: int = 1,
    steps: int = 10,
    quantize_1bit: bool = True,
    verification_percent: int = 25,
    timeout: float = 400.0,
) -> RunOutcome:
    """Run `clients - malicious` honest clients and `malicious` attackers of `attack` (None:
    all `clients` honest, the clean run; its settings are then `quantize_1bit` and
    `verification_percent`) to the end of `steps` steps, and measure."""
    tmp.mkdir(parents=True, exist_ok=True)
    if attack is None:
        malicious = 0
    else:
        quantize_1bit = attack.quantize_1bit
        verification_percent = attack.verification_percent
    tamper = attack is not None and attack.tamper
    honest_count = clients if tamper else clients - malicious
    outsiders = attack is not None and (attack.flood or attack.intruder)
    members = honest_count if outsiders else clients
    state = write_state(
        tmp / "state.toml",
        total_steps=steps,
        init_min_clients=members,
        min_clients=max(2, honest_count),
        witness_nodes=0,  # every member witnesses: a quorum of honest witnesses always exists
        max_round_train_time=10,
        # at least one sample per client: a trainer given no batch sends no result, and the
        # witnesses' health checks drop it (an idle trainer is not told from a silent one)
        batch=max(6, clients),
        verification_percent=verification_percent,
        quantize_1bit="true" if quantize_1bit else "false",
    )
    cluster = Cluster(tmp, state)
    checkpoints = tmp / "checkpoints"
    floods: list[Host] = []
    proxies: list[TamperProxy] = []
    attackers: list[Proc] = []
    flood = attack.flood if attack is not None else None
    keys = _Keys(tmp, honest_count, malicious) if attack is not None and attack.intruder else None
    started = time.monotonic()
    try:
        if flood == "server":
            cluster.start_server("--pre-join-timeout", "2")
            for i in range(malicious):
                floods.append(Flood(cluster.port, f"127.0.0.{2 + i}", FLOOD_SOCKETS).start())
        elif keys is not None:
            cluster.start_server("--authorized-keys", str(keys.authorized))
        else:
            cluster.start_server()
        honest = []
        relayed = ["--advertise-addr", f"127.0.0.1:{free_port()}"] if flood == "relay" else []
        for i in range(honest_count):
            extra = ["--checkpoint-dir", str(checkpoints)] if i == 0 else []
            identity = [] if keys is None else ["-i", str(keys.honest[i])]
            if tamper and i >= honest_count - malicious:  # the last `malicious` clients
                proxy = TamperProxy(cluster.port, TAMPER_FLIPS).start()
                proxies.append(proxy)
                extra += ["--server-addr", f"127.0.0.1:{proxy.port}"]
            client = cluster.start_client(*extra, *identity, *relayed)
            honest.append(client)
            if flood == "peer" and i < malicious:
                peer_flood = Flood(client.p2p_port(), f"127.0.0.{2 + i}", FLOOD_SOCKETS)
                floods.append(peer_flood.start())
        if flood == "decode_bomb":
            targets: list[tuple[int, bytes | None]] = [
                (cluster.port, coordinator_domain("e2e-run")),
                *((client.p2p_port(), None) for client in honest),
            ]
            for i in range(malicious):
                floods.append(DecodeBomber(targets, f"127.0.0.{2 + i}").start())
        if flood == "hash_forger":
            for _ in range(malicious):
                floods.append(HashForger(cluster.port, "e2e-run").start())
        if flood == "relay":  # once the epoch's members are fixed: the keys stay pending
            wait_for(lambda: applied_hashes(honest[0]), timeout, "a first applied step")
            for i in range(malicious):
                floods.append(RelayExhauster(cluster.port, "e2e-run", f"127.0.0.{2 + i}").start())
        if keys is not None and attack is not None:
            for i in range(malicious):
                attackers.append(cluster.start_client(*keys.intruder(i, attack.intruder)))
        if attack is not None and attack.program is not None:
            gradients = tmp / "attacker-results"
            for _ in range(malicious):
                attackers.append(
                    cluster.start_client(
                        "--write-gradients-dir", str(gradients), program=attack.command()
                    )
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in honest):
            time.sleep(0.5)
        seconds = time.monotonic() - started
        diagnostics = cluster.diagnostics()
    finally:
        for flood in floods:
            flood.stop()
        cluster.stop()
        for proxy in proxies:
            proxy.stop()
    tables = [applied_hashes(p) for p in honest]
    common = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
    agree = bool(common) and all(len({t[s] for t in tables}) == 1 for s in common)
    finite = all(math.isfinite(v) for p in honest for v in losses(p).values())
    if attack is not None and attack.flood == "hash_forger":
        # nobody to remove (the keys never joined): their reports must count for nothing
        flagged = cluster.server is None or bool(cluster.server.events_with("majority_hash"))
        removed = [host.shed and not flagged for host in floods]
    elif attack is not None and attack.flood:
        removed = [host.shed for host in floods]
    elif attack is not None and attack.intruder:
        removed = [p.popen.returncode == 1 and _refused(p) for p in attackers]
    elif tamper:  # every altered frame was refused: the server and the client each said so
        server_log = cluster.server.log_path.read_text() if cluster.server else ""
        tampered = honest[honest_count - malicious :]
        removed = [
            proxy.flipped == list(TAMPER_FLIPS)
            and AUTHENTICATION_FAILED in client.log_path.read_text()
            and AUTHENTICATION_FAILED in server_log
            for proxy, client in zip(proxies, tampered, strict=True)
        ]
    else:
        convicted = convicted_ids(cluster.server) if cluster.server else set()
        removed = [client_id(p) in convicted or bool(p.events(DROPPED_LINE)) for p in attackers]
    convicted_all = convicted_ids(cluster.server) if cluster.server else set()
    honest_convicted = sorted(
        str(i) for i in (client_id(p) for p in honest) if i is not None and i in convicted_all
    )
    return RunOutcome(
        attack=attack.name if attack is not None else "clean",
        clients=clients,
        malicious=malicious,
        steps=steps,
        seconds=seconds,
        honest_exit_codes=[p.popen.returncode for p in honest],
        common_steps=common,
        hashes_agree=agree,
        losses_finite=finite,
        eval_loss=eval_loss(checkpoints, Path(cluster.env()["PSYCHE_CACHE_DIR"])),
        attackers_removed=removed,
        honest=honest,
        attackers=attackers,
        server=cluster.server,
        floods=floods,
        diagnostics=diagnostics,
        removal_steps=[removal_step(cluster.server, p) for p in attackers],
        honest_convicted=honest_convicted,
        honest_dropped=sum(1 for p in honest if p.events(DROPPED_LINE)),
    )


def _refused(proc: Proc) -> bool:
    """Whether a client process printed the server's refusal of its Join."""
    return REFUSED_LINE in proc.log_path.read_text(errors="replace")


class _Keys:
    """The key files of a permissioned run: the honest clients' keys and an authorizer's are
    listed in `authorized`; intruders hold keys of their own (see `intruder`)."""

    def __init__(self, tmp: Path, honest: int, intruders: int) -> None:
        self.tmp = tmp
        self.honest = [self._write(f"honest{i}.key")[0] for i in range(honest)]
        _, self.authorizer = self._write("authorizer.key")
        listed = [Identity.load(path).public_key for path in self.honest]
        self.authorized = tmp / "authorized_keys"
        self.authorized.write_text(
            "".join(f"{key.hex()}\n" for key in (*listed, self.authorizer.public_key))
        )
        self.intruders = intruders

    def _write(self, name: str) -> tuple[Path, Identity]:
        identity = Identity.generate()
        path = self.tmp / name
        path.write_bytes(identity.secret_bytes())
        return path, identity

    def intruder(self, index: int, kind: str | None) -> list[str]:
        """`psyche-client train` flags of intruder `index`: an `unlisted` key, or (for
        `bad_delegation`) an expired delegation at even indices and a forged one at odd ones
        (a genuine statement with the intruder's key added, so its signature fails)."""
        path, identity = self._write(f"intruder{index}.key")
        if kind == "unlisted":
            return ["-i", str(path)]
        now = int(time.time())
        if index % 2 == 0:
            statement = sign_authorization(
                self.authorizer, "e2e-run", [identity.public_key], now - 60
            )
        else:
            genuine = sign_authorization(
                self.authorizer, "e2e-run", [Identity.generate().public_key], now + 3600
            )
            statement = dataclasses.replace(
                genuine, delegates=(*genuine.delegates, identity.public_key)
            )
        auth = self.tmp / f"intruder{index}.auth"
        auth.write_bytes(encode_authorization(statement))
        return ["-i", str(path), "--authorization", str(auth)]
