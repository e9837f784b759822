"""In-process harness: a real `Coordinator`, N `RoundRunner`s with the dummy backend, an
in-memory peer network and a fake integer clock. Used by the client pipeline tests."""

from __future__ import annotations

import asyncio
import hashlib
import random
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psyche_client.p2p.announcements import message_id
from psyche_client.round.ports import RunnerOptions
from psyche_client.round.runner import RoundRunner
from psyche_client.training.backend import DummyBackend
from psyche_common.batch_id import BatchId
from psyche_common.config.loading import parse_state
from psyche_common.coordinator import (
    Accusation,
    ClientState,
    Coordinator,
    CoordinatorError,
    Witness,
)
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.protocol import Identity

STATE_TOML = """
run_id = "pipeline-test"
run_state = "WaitingForMembers"
[config]
warmup_time = 5
cooldown_time = 2
max_round_train_time = 6
round_witness_time = 1
epoch_time = {epoch_time}
waiting_for_members_extra_time = 1
total_steps = {total_steps}
init_min_clients = {min_clients}
min_clients = 2
witness_nodes = {witness_nodes}
verification_percent = 0
global_batch_size_start = 6
global_batch_size_end = 6
global_batch_size_warmup_tokens = 0
[model.LLM]
architecture = "HfLlama"
data_type = "Pretraining"
max_seq_len = 16
cold_start_warmup_steps = 0
data_location = {{ Builtin = "python-stdlib" }}
[model.LLM.checkpoint.Hub]
repo_id = "builtin:llama-tiny"
[model.LLM.lr_schedule.Constant]
base_lr = 1.0e-3
warmup_init_lr = 0.0
warmup_steps = 0
[model.LLM.optimizer.Distro]
compression_chunk = 64
compression_topk = 8
quantize_1bit = true
compression_decay = 0.999
"""


def make_coordinator(
    epoch_time: int = 12, total_steps: int = 10, min_clients: int = 3, witness_nodes: int = 1
) -> Coordinator:
    text = STATE_TOML.format(
        epoch_time=epoch_time,
        total_steps=total_steps,
        min_clients=min_clients,
        witness_nodes=witness_nodes,
    )
    return Coordinator.from_state_file(parse_state(tomllib.loads(text)))


class MemoryNetwork:
    """Shared blob store + announcement fan-out; `corrupt_from` peers serve damaged blobs.

    Like the real P2P inbox, each receiver drops an announcement it has already seen
    (same `message_id`), so identical re-sent messages are delivered once.
    """

    def __init__(self) -> None:
        self.runners: dict[bytes, RoundRunner] = {}
        self.seen: dict[bytes, set[bytes]] = {}  # receiver -> message ids delivered
        self.blobs: dict[bytes, dict[bytes, bytes]] = {}  # holder -> hash -> data
        self.corrupt_from: set[bytes] = set()
        self.dead: set[bytes] = set()
        self.corrupt_served = 0

    def endpoint(self, me: bytes) -> MemoryEndpoint:
        self.blobs.setdefault(me, {})
        return MemoryEndpoint(self, me)


@dataclass
class MemoryEndpoint:
    hub: MemoryNetwork
    me: bytes

    async def announce(self, announcement: Any) -> None:
        if self.me in self.hub.dead:
            return
        key = message_id(announcement)
        for peer, runner in list(self.hub.runners.items()):
            if peer == self.me or peer in self.hub.dead:
                continue
            seen = self.hub.seen.setdefault(peer, set())
            if key not in seen:
                seen.add(key)
                asyncio.get_running_loop().call_soon(runner.on_announcement, announcement)

    def publish_blob(self, data: bytes, step: int) -> bytes:
        digest = hashlib.sha256(data).digest()
        self.hub.blobs[self.me][digest] = data
        return digest

    async def fetch_blob(self, blob_hash: bytes, size: int, providers: Sequence[bytes]) -> bytes:
        await asyncio.sleep(0)
        for peer in providers:
            if peer in self.hub.dead:
                continue
            data = self.hub.blobs.get(peer, {}).get(blob_hash)
            if data is None:
                continue
            if peer in self.hub.corrupt_from:
                self.hub.corrupt_served += 1
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            if hashlib.sha256(data).digest() == blob_hash:
                self.hub.blobs[self.me][blob_hash] = data
                return data
        raise ConnectionError(f"no provider holds blob {blob_hash.hex()[:8]}")

    def begin_step(self, step: int) -> None:
        return None


@dataclass
class FakeUplink:
    server: FakeServer
    me: bytes

    async def send_witness(self, witness: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.server.witness_hashes.append((self.me, metadata["step"], metadata["weights_hash"]))
        self.server.call(lambda c: c.witness(self.me, Witness.from_wire(witness), self.server.now))

    async def send_warmup_witness(self, witness: dict[str, Any]) -> None:
        self.server.warmup_witnesses.append((self.server.coordinator.progress.epoch, self.me))
        self.server.call(
            lambda c: c.warmup_witness(
                self.me, Witness.from_wire(witness), self.server.now, self.server.seed()
            )
        )

    async def send_health_check(
        self, checks: list[tuple[bytes, dict[str, Any]]], step: int, weights_hash: bytes
    ) -> None:
        self.server.record_hash(self.me, step, weights_hash)
        if checks:
            parsed = [(cid, CommitteeProof.from_wire(p)) for cid, p in checks]
            self.server.accusations.append((self.me, [cid for cid, _ in checks]))
            self.server.call(lambda c: c.health_check(self.me, parsed))

    async def send_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        return None

    async def send_accusation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int
    ) -> None:
        accusation = Accusation(step, self.me, trainer, batch, agreement_milli)
        self.server.call(lambda c: c.accuse(self.me, accusation))

    async def send_join(self) -> None:
        self.server.rejoins.append(self.me)
        if self.me not in self.server.pending:
            self.server.pending.append(self.me)


@dataclass
class FakeServer:
    coordinator: Coordinator
    now: int = 1_000_000
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    pending: list[bytes] = field(default_factory=list)
    runners: dict[bytes, RoundRunner] = field(default_factory=dict)
    hashes: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    witness_hashes: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    accusations: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    warmup_witnesses: list[tuple[int, bytes]] = field(default_factory=list)  # (epoch, sender)
    rejoins: list[bytes] = field(default_factory=list)
    kicked: set[bytes] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    dirty: bool = False

    def seed(self) -> int:
        return self.rng.getrandbits(64)

    def record_hash(self, client: bytes, step: int, weights_hash: bytes) -> None:
        self.hashes.setdefault(step, {})[client] = weights_hash

    def call(self, action: Callable[[Coordinator], Any]) -> None:
        try:
            action(self.coordinator)
            self.dirty = True
        except CoordinatorError as exc:
            self.errors.append(str(exc))

    def kick_dropped(self) -> None:
        """As the server does: each dropped record's client leaves the pending set once."""
        dropped = [
            c.id
            for c in self.coordinator.epoch_state.exited_clients
            if c.state in (ClientState.Dropped, ClientState.Ejected)
        ]
        self.kicked &= set(dropped)
        for client_id in dropped:
            if client_id not in self.kicked:
                self.kicked.add(client_id)
                if client_id in self.pending:
                    self.pending.remove(client_id)

    async def broadcast(self) -> None:
        wire = self.coordinator.to_wire()
        for peer, runner in list(self.runners.items()):
            if peer in self.pending or peer in self.kicked:  # kicked clients stay connected
                await runner.on_state(Coordinator.from_wire(wire))

    async def step(self, clock_step: int = 1) -> None:
        self.now += clock_step
        self.call(lambda c: c.tick(list(self.pending), self.now, self.seed()))
        self.kick_dropped()
        await self.broadcast()
        for _ in range(5):
            for runner in list(self.runners.values()):
                await runner.tick()
            await asyncio.sleep(0.005)
            if self.dirty:
                self.dirty = False
                await self.broadcast()


def add_client(server: FakeServer, hub: MemoryNetwork, delay: float = 0.0) -> RoundRunner:
    identity = Identity.generate()
    me = identity.public_key

    async def load(_coordinator: Any) -> DummyBackend:
        return DummyBackend(delay)

    runner = RoundRunner(
        identity,
        hub.endpoint(me),
        FakeUplink(server, me),
        load,
        None,
        RunnerOptions(download_backoff=0.01, needs_data=False),
    )
    hub.runners[me] = runner
    server.runners[me] = runner
    server.pending.append(me)
    return runner
