"""The client's TCP connection to the coordinator server.

Connect, answer the challenge with our identity (checking the server's key against
`--server-key` when one is given), and over the encrypted link the handshake opens
(`psyche_common.protocol.secure_channel`) send `Join` once, then read the server's
`CoordinatorState` frames (de-duplicated by the hash of their bytes, like the reference) into
an asyncio queue, and send `Witness`, `WarmupWitness`, `HealthCheck` and `Checkpoint`.
Writes are serialized by a lock; every network wait has a timeout. After `KEEPALIVE_INTERVAL`
seconds without sending anything, the link sends an empty `HealthCheck` (no accusations, no
weights report: the server only notes the key is alive), so the server's idle timeout never
drops a client that is merely waiting. A closed connection ends
`states()` with `ServerLinkError` naming the reason, a `Rejected` frame with `ServerRejected`.
One link is one connection; `reconnect.ServerSession` makes new ones when it is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId
from psyche_common.config import AnyCheckpoint, HubCheckpoint
from psyche_common.config import Checkpoint as CheckpointField
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.types import Witness as WitnessReport
from psyche_common.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameAuthenticationError,
    HandshakeRefused,
    Identity,
    ProtocolError,
    SecureChannel,
    ServerKeyMismatch,
    connect_handshake,
    coordinator_domain,
    decode_payload,
)
from psyche_common.protocol.messages import (
    Accusation,
    AnyClientMessage,
    Attestation,
    Checkpoint,
    CoordinatorState,
    Equivocation,
    HealthCheck,
    HealthCheckEntry,
    InvalidMessage,
    Join,
    Reachability,
    Rejected,
    WarmupWitness,
    WeightsMismatch,
    Witness,
    WitnessMetadata,
    is_already_connected,
    parse_server_message,
    to_wire,
)
from pydantic import TypeAdapter

log = logging.getLogger("psyche.client.server")

_CHECKPOINT_WIRE: TypeAdapter[AnyCheckpoint] = TypeAdapter(CheckpointField)

CLIENT_VERSION = "psyche-py-client/0.1"
CONNECT_TIMEOUT = 15.0
WRITE_TIMEOUT = 15.0
# The server broadcasts its state at least every tick (500 ms); this much silence means the
# server or the path to it is gone even if no FIN/RST ever arrives.
SILENCE_TIMEOUT = 30.0
# The server closes connections silent for its --idle-timeout (300 s by default).
KEEPALIVE_INTERVAL = 30.0
# A coordinator state with 256 clients and 32 witnesses is a few hundred KiB.
MAX_SERVER_FRAME = max(DEFAULT_MAX_FRAME_SIZE, 64 * 1024 * 1024)


class ServerLinkError(ConnectionError):
    """The server connection failed, was closed, or the server rejected us."""


class WrongServerKey(ServerLinkError):
    """The server's identity key is not the `--server-key` the client was given (final)."""


class ServerRejected(ServerLinkError):
    """The server sent `Rejected`. `retryable` only when it still holds another connection of
    our identity (a dead one it has not noticed yet); any other reason (a wrong run id) is
    final."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"server rejected this client: {reason}")
        self.reason = reason
        self.retryable = is_already_connected(reason)


@dataclass(frozen=True)
class ServerUpdate:
    """One (new) coordinator state: the coordinator wire dict and member P2P addresses."""

    coordinator: dict[str, object]
    peers: dict[bytes, str]
    unreachable: frozenset[bytes] = frozenset()
    """Members that accept no P2P connections (the server's probe failed)."""
    authorizers: Mapping[bytes, bytes] = field(default_factory=dict)
    """Member → authorizer of the delegate members of a permissioned run (`psyche_common.votes`)."""


def parse_server_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) → (host, port); raises ValueError naming the text."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"server address {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class ServerLink:
    def __init__(
        self,
        channel: SecureChannel,
        identity: Identity,
        silence_timeout: float = SILENCE_TIMEOUT,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
    ) -> None:
        self._channel = channel
        self.keepalive_interval = keepalive_interval
        self._last_sent = time.monotonic()
        self.keepalives_sent = 0
        self._writer = channel.writer
        self.identity = identity
        self.silence_timeout = silence_timeout
        self._write_lock = asyncio.Lock()
        self._last_digest: bytes | None = None
        self._join: Join | None = None
        self._holds_model: Callable[[], bool] = lambda: True
        self.states_received = 0
        self.on_weights_mismatch: Callable[[WeightsMismatch], None] | None = None
        """Called when the server says our weights differ from the majority's."""
        self.on_reachability: Callable[[Reachability], None] | None = None
        """Called with the server's verdict on our advertised P2P address after each Join."""

    @classmethod
    async def connect(
        cls,
        server_addr: str,
        identity: Identity,
        run_id: str,
        p2p_address: str,
        timeout: float = CONNECT_TIMEOUT,
        authorization: bytes | None = None,
        holds_model: Callable[[], bool] = lambda: True,
        server_key: bytes | None = None,
    ) -> ServerLink:
        """Connect, handshake and send our Join; `holds_model` is asked at every Join (the
        server keeps a run's peer-to-peer checkpoint only while someone holds the weights);
        with `server_key`, only a server proving that identity key is joined."""
        host, port = parse_server_addr(server_addr)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            reason = str(exc) or f"no answer within {timeout:g} s"
            raise ServerLinkError(f"cannot connect to server {server_addr}: {reason}") from exc
        try:
            channel = await connect_handshake(
                reader,
                writer,
                identity,
                domain=coordinator_domain(run_id),
                timeout=timeout,
                server_key=server_key,
            )
        except ServerKeyMismatch as exc:
            writer.transport.abort()
            raise WrongServerKey(f"server {server_addr}: {exc}") from exc
        except HandshakeRefused as exc:
            writer.transport.abort()
            raise ServerLinkError(
                f"server {server_addr} refused the handshake: {exc.reason}; this client's "
                f"--run-id is {run_id!r}"
            ) from exc
        except TimeoutError as exc:
            writer.transport.abort()
            raise ServerLinkError(
                f"no Psyche handshake from {server_addr} within {timeout:g} s (is it a "
                "psyche-server coordinator port?)"
            ) from exc
        except (ProtocolError, OSError) as exc:
            writer.transport.abort()
            raise ServerLinkError(
                f"handshake with server {server_addr} failed: {exc or type(exc).__name__} (is "
                "it a psyche-server coordinator port?)"
            ) from exc
        link = cls(channel, identity)
        link._holds_model = holds_model
        link._join = Join(
            run_id=run_id,
            p2p_address=p2p_address,
            client_version=CLIENT_VERSION,
            authorization=authorization,
        )
        try:
            await link.send_join()
        except (ServerLinkError, OSError) as exc:
            await link.close()
            raise ServerLinkError(f"cannot join at server {server_addr}: {exc}") from exc
        log.info("connected to server %s as %s", server_addr, identity.short_id)
        return link

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)

    async def states(self) -> AsyncIterator[ServerUpdate]:
        """Yield every new coordinator state until the connection ends (then raise)."""
        while True:
            try:
                raw = await self._channel.read_payload(
                    MAX_SERVER_FRAME, timeout=self.silence_timeout
                )
                message = parse_server_message(decode_payload(raw))
            except TimeoutError as exc:
                raise ServerLinkError(
                    f"server connection lost: nothing received for {self.silence_timeout:g} s"
                ) from exc
            except InvalidMessage as exc:
                raise ServerLinkError(f"server sent an invalid message: {exc}") from exc
            except FrameAuthenticationError as exc:
                log.warning("closing the link to the server: %s", exc)
                raise ServerLinkError(f"server connection closed: {exc}") from exc
            except (ProtocolError, OSError) as exc:
                raise ServerLinkError(f"server connection lost: {exc}") from exc
            if isinstance(message, Rejected):
                raise ServerRejected(message.reason)
            if time.monotonic() - self._last_sent >= self.keepalive_interval:
                self.keepalives_sent += 1
                await self._send(HealthCheck())
            if isinstance(message, WeightsMismatch):
                if self.on_weights_mismatch is not None:
                    self.on_weights_mismatch(message)
                continue
            if isinstance(message, Reachability):
                if self.on_reachability is not None:
                    self.on_reachability(message)
                continue
            assert isinstance(message, CoordinatorState)
            digest = hashlib.sha256(raw).digest()
            if digest == self._last_digest:
                continue
            self._last_digest = digest
            self.states_received += 1
            yield ServerUpdate(
                dict(message.coordinator),
                dict(message.peers),
                frozenset(message.unreachable),
                dict(message.authorizers),
            )

    async def _send(self, message: AnyClientMessage) -> None:
        async with self._write_lock:
            try:
                async with asyncio.timeout(WRITE_TIMEOUT):
                    await self._channel.send(to_wire(message))
                self._last_sent = time.monotonic()
            except (OSError, TimeoutError) as exc:
                raise ServerLinkError(f"cannot send {type(message).__name__}: {exc}") from exc

    # ---- the Uplink protocol of the round runner --------------------------------------

    async def send_join(self) -> None:
        """(Re)send the Join of this connection: once at connect, again after being dropped
        or once the model is loaded (saying whether we hold the weights now)."""
        assert self._join is not None, "send_join before connect"
        await self._send(self._join.model_copy(update={"holds_model": self._holds_model()}))

    async def send_witness(self, witness: WitnessReport, metadata: WitnessMetadata) -> None:
        await self._send(Witness(witness=witness.to_wire(), metadata=metadata))

    async def send_warmup_witness(self, witness: WitnessReport) -> None:
        await self._send(WarmupWitness(witness=witness.to_wire()))

    async def send_health_check(
        self, checks: Sequence[tuple[bytes, CommitteeProof]], step: int, weights_hash: bytes
    ) -> None:
        entries = [HealthCheckEntry(id=cid, proof=proof.to_wire()) for cid, proof in checks]
        await self._send(HealthCheck(checks=entries, step=step, weights_hash=weights_hash))

    async def send_checkpoint(self, checkpoint: HubCheckpoint) -> None:
        """In the state-file form the server parses: `{"Hub": {"repo_id", "revision"}}`."""
        await self._send(Checkpoint(checkpoint=_CHECKPOINT_WIRE.dump_python(checkpoint)))

    async def send_equivocation(self, proof: EquivocationProof) -> None:
        wire = proof.to_wire()
        await self._send(Equivocation(first=wire["first"], second=wire["second"]))

    async def send_accusation(
        self,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None = None,
    ) -> None:
        await self._send(
            Accusation(
                step=step,
                trainer=trainer,
                batch=batch.to_wire(),
                agreement_milli=agreement_milli,
                commitment=commitment,
            )
        )

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        await self._send(
            Attestation(
                step=step,
                trainer=trainer,
                batch=batch.to_wire(),
                agreement_milli=agreement_milli,
                commitment=commitment,
            )
        )
