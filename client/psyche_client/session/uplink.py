"""The round pipeline's `Uplink` for the whole life of the client, across reconnections.

The pipeline is built once and keeps one uplink, while the server connection underneath may be
lost and made again (`reconnect.ServerSession`). `SwitchableUplink` forwards every message to
the current `ServerLink`. With no connection, or when a send fails, the message is dropped
with a log line naming it instead of failing the client: the coordinator that would have
received it is gone or unreachable, and a new connection starts from the server's new states.
A failed send also closes that link, so the reader notices the loss and reconnects.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from psyche_common.batch_id import BatchId
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.types import Witness
from psyche_common.protocol.messages import WitnessMetadata

from psyche_client.session.server_link import ServerLink, ServerLinkError

log = logging.getLogger("psyche.client.server")


class SwitchableUplink:
    """Forwards to the attached `ServerLink`; drops messages while there is none."""

    def __init__(self) -> None:
        self.link: ServerLink | None = None
        self.dropped = 0
        """Messages not delivered (no connection, or the send failed)."""

    def attach(self, link: ServerLink) -> None:
        self.link = link

    def detach(self) -> ServerLink | None:
        link, self.link = self.link, None
        return link

    async def _forward(self, what: str, send: Callable[[ServerLink], Awaitable[None]]) -> None:
        link = self.link
        if link is None:
            self.dropped += 1
            log.info("%s not sent: no server connection (reconnecting)", what)
            return
        try:
            await send(link)
        except ServerLinkError as exc:
            self.dropped += 1
            log.warning("%s not sent: %s", what, exc)
            await link.close()  # the reader then fails too, and the session reconnects

    async def send_witness(self, witness: Witness, metadata: WitnessMetadata) -> None:
        await self._forward("Witness", lambda link: link.send_witness(witness, metadata))

    async def send_warmup_witness(self, witness: Witness) -> None:
        await self._forward("WarmupWitness", lambda link: link.send_warmup_witness(witness))

    async def send_health_check(
        self, checks: Sequence[tuple[bytes, CommitteeProof]], step: int, weights_hash: bytes
    ) -> None:
        await self._forward(
            "HealthCheck", lambda link: link.send_health_check(checks, step, weights_hash)
        )

    async def send_checkpoint(self, checkpoint: HubCheckpoint) -> None:
        await self._forward("Checkpoint", lambda link: link.send_checkpoint(checkpoint))

    async def send_join(self) -> None:
        await self._forward("Join", lambda link: link.send_join())

    async def send_accusation(
        self,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None = None,
    ) -> None:
        await self._forward(
            "Accusation",
            lambda link: link.send_accusation(step, trainer, batch, agreement_milli, commitment),
        )

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        await self._forward(
            "Attestation",
            lambda link: link.send_attestation(step, trainer, batch, agreement_milli, commitment),
        )

    async def send_equivocation(self, proof: EquivocationProof) -> None:
        await self._forward("Equivocation", lambda link: link.send_equivocation(proof))
