"""A model-free protocol client for integration tests of the coordinator server.

It speaks the real protocol (handshake, Join, witnesses, health checks) and plays an honest
client's coordinator-facing part without training anything:
- in Warmup, once it sees itself in the epoch, it sends a warmup witness;
- in each training round, after `train_delay` seconds, it sends a round witness when elected
  (participant bloom = SHA-256 of every epoch client except `exclude_from_bloom`), with its
  `weights_hash` in the metadata;
- from height 2 on, it accuses every client that the previous round's witnesses did not vouch
  for (a real `HealthCheck` with a committee proof).
`abort()` drops the socket like a crash; `close()` ends it politely. Reusable by other suites.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from psyche_common.bloom import Bloom
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.committee import CommitteeSelection, WitnessProof
from psyche_common.coordinator.errors import CoordinatorError
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.types import RunState, Witness
from psyche_common.protocol import (
    ConnectionClosed,
    HandshakeError,
    Identity,
    ProtocolError,
    SecureChannel,
    connect_handshake,
    coordinator_domain,
)
from psyche_common.protocol.messages import (
    CoordinatorState,
    HealthCheck,
    HealthCheckEntry,
    Join,
    Reachability,
    Rejected,
    WarmupWitness,
    WeightsMismatch,
    WitnessMetadata,
    parse_server_message,
    to_wire,
)
from psyche_common.protocol.messages import Witness as WitnessMessage

ZERO_MERKLE = bytes(32)


class ProtocolClient:
    def __init__(
        self,
        port: int,
        run_id: str,
        identity: Identity | None = None,
        *,
        host: str = "127.0.0.1",
        p2p_address: str | None = None,
        auto: bool = True,
        train_delay: float = 0.3,
        warmup_delay: float = 0.5,
        exclude_from_bloom: Iterable[bytes] = (),
        witness: bool = True,
        health_checks: bool = True,
        weights_hash: Callable[[int], bytes] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.run_id = run_id
        self.identity = identity or Identity.generate()
        self.id = self.identity.public_key
        self.p2p_address = p2p_address or f"127.0.0.1:{10000 + self.id[0] * 100 + self.id[1] % 100}"
        self.auto = auto
        self.train_delay = train_delay
        self.warmup_delay = warmup_delay
        self.exclude_from_bloom = set(exclude_from_bloom)
        self.send_witnesses = witness
        self.send_health_checks = health_checks
        self.weights_hash = weights_hash or (lambda step: hashlib.sha256(b"w%d" % step).digest())
        self.coordinator: Coordinator | None = None
        self.authorizers: dict[bytes, bytes] = {}
        """The latest state's member → authorizer map (delegates of a permissioned run)."""
        self.peers: dict[bytes, str] = {}
        self.states_received = 0
        self.rejected: str | None = None
        self.mismatches: list[WeightsMismatch] = []
        self.reachability: list[Reachability] = []
        self.unreachable: list[bytes] = []
        self.closed_reason: str | None = None
        self.sent: list[str] = []
        self._channel: SecureChannel | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._state_event = asyncio.Event()
        self._warmup_sent: set[int] = set()
        self._witness_scheduled: set[tuple[int, int, int]] = set()
        self._health_sent: set[tuple[int, int, int]] = set()

    @property
    def short_id(self) -> str:
        return self.id[:4].hex()

    # ------------------------------------------------------------------ connection

    async def connect(
        self,
        join: bool = True,
        run_id: str | None = None,
        handshake_run_id: str | None = None,
        authorization: bytes | None = None,
    ) -> ProtocolClient:
        """Handshake for `handshake_run_id` (default: this client's run), then Join `run_id`
        (presenting `authorization`, a signed delegation, when given)."""
        reader, self._writer = await asyncio.open_connection(self.host, self.port)
        domain = coordinator_domain(handshake_run_id or self.run_id)
        try:
            self._channel = await connect_handshake(
                reader, self._writer, self.identity, domain=domain, timeout=5
            )
        except HandshakeError as exc:  # the server refused the handshake, with its reason
            self.rejected = self.closed_reason = str(exc)
            self._writer.close()
            self._reader_task = asyncio.create_task(asyncio.sleep(0))
            return self
        self._reader_task = asyncio.create_task(self._read_loop())
        if join:
            await self.send(
                Join(
                    run_id=run_id or self.run_id,
                    p2p_address=self.p2p_address,
                    client_version="test",
                    authorization=authorization,
                )
            )
        return self

    async def send(self, message: Any) -> None:
        assert self._channel is not None
        self.sent.append(message.type)
        await self._channel.send(to_wire(message))

    async def send_raw(self, obj: Any) -> None:
        assert self._channel is not None
        await self._channel.send(obj)

    def abort(self) -> None:
        """Drop the connection like a killed process (no goodbye)."""
        if self._writer is not None:
            self._writer.transport.abort()
        self._cancel_tasks()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._cancel_tasks()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    @property
    def connected(self) -> bool:
        return self._reader_task is not None and not self._reader_task.done()

    async def _read_loop(self) -> None:
        assert self._channel is not None
        try:
            while True:
                message = parse_server_message(await self._channel.read(64 * 1024 * 1024))
                if isinstance(message, Rejected):
                    self.rejected = message.reason
                    continue
                if isinstance(message, WeightsMismatch):
                    self.mismatches.append(message)
                    continue
                if isinstance(message, Reachability):
                    self.reachability.append(message)
                    continue
                self._on_state(message)
        except (ConnectionClosed, OSError) as exc:
            self.closed_reason = str(exc)
        except ProtocolError as exc:
            self.closed_reason = f"protocol error: {exc}"
        finally:
            self._state_event.set()

    def _on_state(self, message: CoordinatorState) -> None:
        self.coordinator = Coordinator.from_wire(message.coordinator)
        self.peers = dict(message.peers)
        self.unreachable = list(message.unreachable)
        self.authorizers = dict(message.authorizers)
        self.states_received += 1
        self._state_event.set()
        self._state_event = asyncio.Event()
        if self.auto:
            self._react(self.coordinator)

    async def wait_for(
        self, predicate: Callable[[Coordinator], bool], timeout: float = 30
    ) -> Coordinator:
        """Wait until a received state satisfies `predicate`; returns that state."""
        async with asyncio.timeout(timeout):
            while True:
                event = self._state_event
                if self.coordinator is not None and predicate(self.coordinator):
                    return self.coordinator
                if not self.connected:
                    raise ConnectionError(
                        f"client {self.short_id} disconnected: {self.closed_reason}"
                    )
                await event.wait()

    async def wait_closed(self, timeout: float = 10) -> str | None:
        assert self._reader_task is not None
        await asyncio.wait_for(asyncio.shield(self._reader_task), timeout)
        return self.closed_reason

    # ------------------------------------------------------------------ behaviour

    def my_index(self, coordinator: Coordinator) -> int | None:
        for index, client in enumerate(coordinator.epoch_state.clients):
            if client.id == self.id:
                return index
        return None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _react(self, coordinator: Coordinator) -> None:
        index = self.my_index(coordinator)
        if index is None:
            return
        state = coordinator.run_state
        epoch_key = coordinator.epoch_state.start_timestamp
        if state == RunState.Warmup and epoch_key not in self._warmup_sent:
            self._warmup_sent.add(epoch_key)
            witness = Witness(proof=WitnessProof(index, index, False), broadcast_merkle=ZERO_MERKLE)
            self._spawn(
                self._send_later(self.warmup_delay, WarmupWitness(witness=witness.to_wire()))
            )
        if state not in (RunState.RoundTrain, RunState.RoundWitness):
            return
        height = coordinator.current_round().height
        round_key = (int(coordinator.progress.epoch), epoch_key, height)
        if (
            self.send_health_checks
            and state == RunState.RoundTrain
            and round_key not in self._health_sent
        ):
            self._health_sent.add(round_key)
            self._send_health_checks(coordinator)
        if self.send_witnesses and round_key not in self._witness_scheduled:
            self._witness_scheduled.add(round_key)
            try:
                proof = CommitteeSelection.from_coordinator(coordinator, 0).get_witness(index)
            except CoordinatorError:
                return
            if proof.witness:
                self._spawn(self._send_witness_later(round_key, proof, coordinator))

    async def _send_later(self, delay: float, message: Any) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(OSError, ConnectionError):
            await self.send(message)

    async def _send_witness_later(
        self, round_key: tuple[int, int, int], proof: WitnessProof, coordinator: Coordinator
    ) -> None:
        await asyncio.sleep(self.train_delay)
        current = self.coordinator
        if current is None or current.run_state not in (RunState.RoundTrain, RunState.RoundWitness):
            return
        if (
            int(current.progress.epoch),
            current.epoch_state.start_timestamp,
            current.current_round().height,
        ) != round_key:
            return
        participants = Bloom.random()
        for client in coordinator.epoch_state.clients:
            if client.id not in self.exclude_from_bloom:
                participants.add(hashlib.sha256(client.id).digest())
        witness = Witness(
            proof=proof, participant_bloom=participants, broadcast_bloom=Bloom.random()
        )
        step = int(current.progress.step)
        metadata = WitnessMetadata(step=step, loss=1.0, weights_hash=self.weights_hash(step))
        with contextlib.suppress(OSError, ConnectionError):
            await self.send(WitnessMessage(witness=witness.to_wire(), metadata=metadata))

    def _send_health_checks(self, coordinator: Coordinator) -> None:
        if coordinator.current_round().height < 2:
            return
        previous = coordinator.previous_round()
        if previous is None or not previous.witnesses:
            return
        try:
            selection = CommitteeSelection.from_coordinator(coordinator, -1)
        except CoordinatorError:
            return
        quorum = witness_quorum(coordinator.config.witness_nodes, len(previous.witnesses))
        checks = []
        for index in range(previous.clients_len):
            client = coordinator.get_client_at_historical_index(index, previous.clients_len)
            if client is None or client.id == self.id:
                continue
            if coordinator.trainer_health_score(client.id, previous.witnesses) < quorum:
                checks.append(
                    HealthCheckEntry(id=client.id, proof=selection.get_committee(index).to_wire())
                )
        if checks:
            self._spawn(self.send(HealthCheck(checks=checks)))


async def start_clients(
    count: int, port: int, run_id: str, pause: float = 0.02, **kwargs: Any
) -> list[ProtocolClient]:
    clients = []
    for _ in range(count):
        clients.append(await ProtocolClient(port, run_id, **kwargs).connect())
        await asyncio.sleep(pause)
    return clients
