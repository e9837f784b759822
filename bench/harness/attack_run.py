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

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from psyche_common.protocol import coordinator_domain

from bench.harness.attack_catalog import Attack
from bench.harness.attack_keys import PermissionedKeys, RunKeys
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
from bench.harness.squatters import DataSquatter
from bench.harness.tamper_proxy import DOWN, UP, Flip, TamperProxy

Host = Flood | DecodeBomber | RelayExhauster | HashForger | DataSquatter

EVAL_SEQUENCES = 64
EVAL_SEQ_LEN = 32
FLOOD_SOCKETS = 300
DROPPED_LINE = "dropped from the epoch by a health check: joining again for the next epoch"
REFUSED_LINE = "server rejected this client: not authorized"
TAMPER_FLIPS = (Flip(0, UP, 1), Flip(1, DOWN, 3))
"""A tampering proxy's flips: the first connection's Join (client → server), then the fourth
frame the server sends on the second connection (a state or the reachability notice)."""
AUTHENTICATION_FAILED = "failed authentication"
SYBIL_DELEGATE_CAP = 1
"""`--max-delegates-per-authorizer` of a `delegated_sybils` run: each owner of sybils gets one
member seat, whatever number of keys it delegates."""
RELAY_PAIR_QUOTA = 8
"""The relay's `max_pipes_per_pair`: what one key may hold of a victim's incoming pipes."""
LOGGED_ACTS = {
    "selective_cheat": {
        "negated": "selective cheat: negating a batch predicted unchecked",
        "trained_honestly": "selective cheat: training honestly a batch predicted checked",
    },
    "colluding_passers": {
        "shielding_passes": "colluding passer: passed a colluder's failing result",
    },
    "sole_liar": {"lies": "sole liar: accused a batch only it checks"},
}
"""Per attack: what its attackers' logs count (one number per attacker), reported in
`RunOutcome.details`: how often an adaptive attacker acted on what it read."""


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
    details: dict[str, Any] = field(default_factory=dict)
    """What some attacks report besides removal (sybils refused, relay pipes granted, replayed
    proofs sent and refused, data-server connections closed)."""

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
    data_server: bool = False,
    timeout: float = 400.0,
) -> RunOutcome:
    """Run `clients - malicious` honest clients and `malicious` attackers of `attack` (None:
    all `clients` honest, the clean run; its settings are then `quantize_1bit`,
    `verification_percent` and `data_server`) to the end of `steps` steps, and measure."""
    tmp.mkdir(parents=True, exist_ok=True)
    if attack is None:
        malicious = 0
    else:
        quantize_1bit, verification_percent, data_server = attack.setting
    tamper = attack is not None and attack.tamper
    intruder = attack.intruder if attack is not None else None
    sybils = intruder == "sybils"
    honest_count = clients if tamper else clients - malicious
    outsiders = attack is not None and (attack.flood or (intruder and not sybils))
    members = honest_count if outsiders else clients
    data_port = free_port()
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
        **({"data_location": f'{{ Server = "127.0.0.1:{data_port}" }}'} if data_server else {}),
    )
    cluster = Cluster(tmp, state)
    checkpoints = tmp / "checkpoints"
    floods: list[Host] = []
    proxies: list[TamperProxy] = []
    attackers: list[Proc] = []
    flood = attack.flood if attack is not None else None
    keys = (
        PermissionedKeys(tmp, honest_count, malicious if sybils else 0)
        if intruder is not None
        else None
    )
    run_keys = (
        RunKeys(tmp, honest_count, malicious, honest_keys=attack.honest_keys)
        if attack is not None and attack.program is not None and keys is None
        else None
    )
    server_flags: list[str] = []
    if data_server:
        server_flags += ["--data-config", str(write_data_config(tmp, cluster.env()))]
    started = time.monotonic()
    try:
        if flood == "server":
            cluster.start_server(*server_flags, "--pre-join-timeout", "2")
            for i in range(malicious):
                floods.append(Flood(cluster.port, f"127.0.0.{2 + i}", FLOOD_SOCKETS).start())
        elif keys is not None:
            cap = ["--max-delegates-per-authorizer", str(SYBIL_DELEGATE_CAP)] if sybils else []
            cluster.start_server(*server_flags, "--authorized-keys", str(keys.authorized), *cap)
        else:
            cluster.start_server(*server_flags)
        if sybils and keys is not None and attack is not None:
            # first, so that they are ahead of the listed keys in join order
            for owner in range(malicious):
                for flags in keys.sybils(owner, sybils_per_owner(honest_count)):
                    attackers.append(cluster.start_client(*flags, program=attack.command()))
        honest = []
        relayed = attack is not None and (attack.relayed or flood == "relay")
        for i in range(honest_count):
            extra = ["--checkpoint-dir", str(checkpoints)] if i == 0 else []
            if keys is not None:
                extra += ["-i", str(keys.honest[i])]
            elif run_keys is not None:
                extra += run_keys.honest_flags(i)
            if relayed:
                extra += ["--advertise-addr", f"127.0.0.1:{free_port()}"]
            if tamper and i >= honest_count - malicious:  # the last `malicious` clients
                proxy = TamperProxy(cluster.port, TAMPER_FLIPS).start()
                proxies.append(proxy)
                extra += ["--server-addr", f"127.0.0.1:{proxy.port}"]
            client = cluster.start_client(*extra)
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
        if flood in ("relay", "data"):  # once the epoch's members are fixed
            wait_for(lambda: bool(applied_hashes(honest[0])), timeout, "a first applied step")
            for i in range(malicious):
                source = f"127.0.0.{2 + i}"
                host: RelayExhauster | DataSquatter = (
                    RelayExhauster(cluster.port, "e2e-run", source)
                    if flood == "relay"
                    else DataSquatter(data_port, "e2e-run", source)
                )
                host.start()
                floods.append(host)
        if keys is not None and intruder is not None and not sybils:
            for i in range(malicious):
                attackers.append(cluster.start_client(*keys.intruder(i, intruder)))
        if run_keys is not None and attack is not None:
            gradients = tmp / "attacker-results"
            for i in range(malicious):
                attackers.append(
                    cluster.start_client(
                        "--write-gradients-dir",
                        str(gradients),
                        *run_keys.attacker_flags(i),
                        program=attack.command(),
                        env=run_keys.attacker_env(i),
                    )
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in honest):
            time.sleep(0.5)
        seconds = time.monotonic() - started
        diagnostics = cluster.diagnostics()
    finally:
        for flood_host in floods:
            flood_host.stop()
        cluster.stop()
        for proxy in proxies:
            proxy.stop()
    tables = [applied_hashes(p) for p in honest]
    common = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
    agree = bool(common) and all(len({t[s] for t in tables}) == 1 for s in common)
    finite = all(math.isfinite(v) for p in honest for v in losses(p).values())
    server = cluster.server
    convicted_all = convicted_ids(server) if server else set()
    details: dict[str, Any] = {}
    if attack is not None and attack.flood == "hash_forger":
        # nobody to remove (the keys never joined): their reports must count for nothing
        flagged = server is None or bool(server.events_with("majority_hash"))
        removed = [host.shed and not flagged for host in floods]
    elif attack is not None and attack.flood:
        removed = [host.shed for host in floods]
        details = _flood_details(floods)
    elif sybils:
        refused = [p.popen.returncode == 1 and _refused(p) for p in attackers]
        removed = refused  # the seated ones serve other weights: docs/security.md says why
        details = {"sybils": len(attackers), "refused": sum(refused)}
    elif intruder is not None:
        removed = [p.popen.returncode == 1 and _refused(p) for p in attackers]
    elif tamper:  # every altered frame was refused: the server and the client each said so
        server_log = server.log_path.read_text() if server else ""
        tampered = honest[honest_count - malicious :]
        removed = [
            proxy.flipped == list(TAMPER_FLIPS)
            and AUTHENTICATION_FAILED in client.log_path.read_text()
            and AUTHENTICATION_FAILED in server_log
            for proxy, client in zip(proxies, tampered, strict=True)
        ]
    elif attack is not None and attack.name == "relay_hog":
        answers = [p.events("relay hog: dials answered") for p in attackers]
        last = [lines[-1] if lines else {} for lines in answers]
        removed = [
            int(line.get("bursts", 0)) > 0 and int(line.get("granted", 0)) <= RELAY_PAIR_QUOTA
            for line in last
        ]
        details = {
            "bursts": [line.get("bursts") for line in last],
            "most_granted_in_a_burst": [line.get("granted") for line in last],
            "refused": [line.get("refused") for line in last],
        }
    elif attack is not None and attack.name == "replayed_equivocation":
        sent = [len(p.events("equivocation replayer: sent a replayed proof")) for p in attackers]
        refusals = [
            line
            for line in (server.lines() if server else [])
            if line.get("message_type") == "Equivocation"
        ]
        removed = [n > 0 and not convicted_all.intersection(_ids(honest)) for n in sent]
        details = {"proofs_sent": sum(sent), "proofs_refused": len(refusals)}
    else:
        removed = [client_id(p) in convicted_all or bool(p.events(DROPPED_LINE)) for p in attackers]
        acts = LOGGED_ACTS.get(attack.name, {}) if attack is not None else {}
        details = {label: [len(p.events(msg)) for p in attackers] for label, msg in acts.items()}
    honest_convicted = sorted(i for i in _ids(honest) if i in convicted_all)
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
        server=server,
        floods=floods,
        diagnostics=diagnostics,
        removal_steps=[removal_step(server, p) for p in attackers],
        honest_convicted=honest_convicted,
        honest_dropped=sum(1 for p in honest if p.events(DROPPED_LINE)),
        details=details,
    )


def sybils_per_owner(honest: int) -> int:
    """Keys each owner of sybils delegates: one more than the honest clients, so that without
    a cap its delegates alone would outvote every honest member."""
    return honest + 1


def write_data_config(tmp: Path, env: dict[str, str]) -> Path:
    """A data.toml serving the `python-stdlib` corpus (the builtin one, so that the held-out
    loss means the same) from a token directory under `tmp`."""
    from psyche_common.data.builtin import python_stdlib_tokens

    tokens = tmp / "tokens"
    tokens.mkdir(exist_ok=True)
    corpus = np.asarray(python_stdlib_tokens(env["PSYCHE_CACHE_DIR"]), dtype="<u2")
    corpus.tofile(tokens / "part0.bin")
    config = tmp / "data.toml"
    config.write_text(
        f'dir = "{tokens}"\ntoken_size = "TwoBytes"\nseq_len = {EVAL_SEQ_LEN}\n'
        f"shuffle_seed = {list(range(32))}\n"
    )
    return config


def _ids(procs: list[Proc]) -> set[str]:
    return {i for i in (client_id(p) for p in procs) if i is not None}


def _flood_details(floods: list[Host]) -> dict[str, Any]:
    squatters = [host for host in floods if isinstance(host, DataSquatter)]
    if not squatters:
        return {}
    return {
        "connections_opened": sum(h.opened for h in squatters),
        "closed_by_the_data_server": sum(h.closed_by_target for h in squatters),
    }


def _refused(proc: Proc) -> bool:
    """Whether a client process printed the server's refusal of its Join."""
    return REFUSED_LINE in proc.log_path.read_text(errors="replace")
