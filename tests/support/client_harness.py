"""In-process harness: a real `Coordinator`, N `RoundRunner`s with the dummy backend, the
shared in-memory peer network and a fake server with an integer clock behind each client's
recording uplink. Used by the client pipeline tests."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psyche_client.round.ports import RunnerOptions
from psyche_client.round.runner import RoundRunner
from psyche_client.training.backend import DummyBackend
from psyche_common.batch_id import BatchId
from psyche_common.config.loading import parse_state
from psyche_common.coordinator import (
    Accusation,
    Attestation,
    ClientState,
    Coordinator,
    CoordinatorError,
    Witness,
)
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.protocol import Identity, verify_signature
from psyche_common.protocol.messages import WitnessMetadata

from tests.support.coordinators import state_document
from tests.support.fakes import MemoryHub, RecordingUplink

PIPELINE_CONFIG: dict[str, Any] = {
    "warmup_time": 5,
    "cooldown_time": 2,
    "max_round_train_time": 6,
    "round_witness_time": 1,
    "waiting_for_members_extra_time": 1,
    "min_clients": 2,
    "global_batch_size_start": 6,
    "global_batch_size_end": 6,
}
PIPELINE_MODEL: dict[str, Any] = {
    "max_seq_len": 16,
    "data_location": {"Builtin": "python-stdlib"},
    "lr_schedule": {"Constant": {"base_lr": 1e-3, "warmup_init_lr": 0.0, "warmup_steps": 0}},
    "optimizer": {
        "Distro": {
            "compression_chunk": 64,
            "compression_topk": 8,
            "quantize_1bit": True,
            "compression_decay": 0.999,
        }
    },
}


def make_coordinator(
    epoch_time: int = 12,
    total_steps: int = 10,
    min_clients: int = 3,
    witness_nodes: int = 1,
    round_witness_time: float = 1,
    per_client_shares: bool = False,
) -> Coordinator:
    """A run waiting for `min_clients` members to start its first epoch."""
    document = state_document(
        run_id="pipeline-test",
        model=PIPELINE_MODEL,
        **{**PIPELINE_CONFIG, "round_witness_time": round_witness_time},
        epoch_time=epoch_time,
        total_steps=total_steps,
        init_min_clients=min_clients,
        witness_nodes=witness_nodes,
        per_client_shares=per_client_shares,
    )
    return Coordinator.from_state_file(parse_state(document))


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

    def on_witness(self, sender: bytes, witness: Witness, metadata: WitnessMetadata) -> None:
        self.witness_hashes.append((sender, metadata.step, metadata.weights_hash))
        # through the wire form, as the server receives it
        received = Witness.from_wire(witness.to_wire())
        self.call(lambda c: c.witness(sender, received, self.now))

    def on_warmup_witness(self, sender: bytes, witness: Witness) -> None:
        self.warmup_witnesses.append((self.coordinator.progress.epoch, sender))
        received = Witness.from_wire(witness.to_wire())
        self.call(lambda c: c.warmup_witness(sender, received, self.now, self.seed()))

    def on_health_check(
        self,
        sender: bytes,
        checks: Sequence[tuple[bytes, CommitteeProof]],
        step: int,
        weights_hash: bytes,
    ) -> None:
        self.record_hash(sender, step, weights_hash)
        if checks:
            parsed = [(cid, CommitteeProof.from_wire(p.to_wire())) for cid, p in checks]
            self.accusations.append((sender, [cid for cid, _ in checks]))
            self.call(lambda c: c.health_check(sender, parsed))

    def on_accusation(
        self,
        sender: bytes,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None,
    ) -> None:
        accusation = Accusation(step, sender, trainer, batch, agreement_milli, commitment)
        self.call(lambda c: c.accuse(sender, accusation))

    def on_equivocation(self, sender: bytes, proof: EquivocationProof) -> None:
        # through the wire form, as the server receives it
        received = EquivocationProof.from_wire(proof.to_wire())
        self.call(lambda c: c.equivocation(sender, received, verify_signature))

    def on_attestation(
        self,
        sender: bytes,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes,
    ) -> None:
        attestation = Attestation(step, sender, trainer, batch, agreement_milli, commitment)
        self.call(lambda c: c.attest(sender, attestation))

    def on_join(self, sender: bytes) -> None:
        self.rejoins.append(sender)
        if sender not in self.pending:
            self.pending.append(sender)

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


def add_client(server: FakeServer, hub: MemoryHub, delay: float = 0.0) -> RoundRunner:
    identity = Identity.generate()
    me = identity.public_key

    async def load(_coordinator: Any) -> DummyBackend:
        return DummyBackend(delay)

    runner = RoundRunner(
        identity,
        hub.join(me),
        RecordingUplink(me, server),
        load,
        None,
        RunnerOptions(download_backoff=0.01, needs_data=False),
    )
    hub.listen(me, runner.on_announcement)
    server.runners[me] = runner
    server.pending.append(me)
    return runner
