"""Result exchange: publishing our results and taking in our peers' (reference §2.5.5, §2.6).

Publishing: the payload becomes a blob, a signed announcement goes to every peer. Taking in:
only a `VerifiedAnnouncement` (the P2P inbox checked its signatures and its size bound, and
lets at most two different commitments of a trainer for a batch through). What depends on the
round it names is checked here: the sender is a member of the epoch, a trainer of the round
and the assignee of the batch; the commitment is new; the size is exactly what the loaded
model's result layout implies (before any byte is fetched). Then its result is downloaded
from its trainer or any peer that holds it, verified against the signed commitment, decoded,
and recorded in the round's blooms; each commitment (`ResultAnnouncement.commitment`, which
names the exact blob) has one `ResultDownload`. A second commitment of the batch's trainer is
kept like the first (every client must know both to decide alike) and the two go to the
coordinator as proof of equivocation (`Uplink.send_equivocation`), which removes the trainer.

Announcements for a round we have not started yet are kept and replayed (`replay_early`),
within the bounds of `round.early`; whatever is not kept is answered "not now" (`route`
returns `Taken.NOT_NOW`): the P2P inbox then forgets it, so a later copy is taken. What is
never to be taken — a round already over, a second Finished of a sender for one step, a result
`accept_result` refuses — is `Taken.REFUSED`: the inbox keeps it as seen and never forwards
it, so one member's flood of distinct announcements for the current step stays with the
peers it pushed to. Our own announcements are re-sent every 10 s.

"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from psyche_common.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.committee import Committee
from psyche_common.protocol import Identity
from psyche_common.retry import call, doubling, failure, retry_on, retrying
from tenacity import RetryCallState

from psyche_client.p2p.announcements import make_result_announcement, proof_of
from psyche_client.p2p.inbox import Taken, VerifiedAnnouncement
from psyche_client.round.consensus import Candidate
from psyche_client.round.context import RoundContext
from psyche_client.round.early import EarlyAnnouncements
from psyche_client.round.ports import PeerNetwork, RunnerOptions, Uplink
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import DecodedResult, TrainedResult

DOWNLOAD_RETRIES = 3
REBROADCAST_INTERVAL = 10.0

log = logging.getLogger("psyche.client")


class ResultExchange:
    def __init__(
        self,
        ctx: RoundContext,
        network: PeerNetwork,
        options: RunnerOptions,
        on_change: Callable[[], None],
        uplink: Uplink,
    ) -> None:
        self.ctx = ctx
        self.network = network
        self.options = options
        self.on_change = on_change
        self.uplink = uplink
        self.early = EarlyAnnouncements()
        self._reported: set[tuple[int, bytes]] = set()
        """(epoch, trainer) whose equivocation this client reported."""
        self._last_rebroadcast = 0.0

    @property
    def identity(self) -> Identity:
        return self.ctx.identity

    async def publish(self, round_: RoundState, batch: BatchId, output: TrainedResult) -> None:
        blob_hash = self.network.publish_blob(output.payload, round_.step)
        announcement = make_result_announcement(
            self.identity,
            run_id=self._run_id(),
            round_seed=round_.roles.random_seed,
            step=round_.step,
            batch_start=batch.start,
            batch_end=batch.end,
            data_hash=output.data_hash,
            blob_hash=blob_hash,
            size=len(output.payload),
        )
        if self.options.write_gradients_dir is not None:
            me = short_id(self.ctx.me)
            name = f"result-{me}-step{round_.step}-batch{batch.start}-{batch.end}.bin"
            path = self.options.write_gradients_dir / name
            await asyncio.to_thread(_write_file, path, output.payload)
        round_.own_announcements.append(announcement)
        self.accept_result(round_, announcement, own_payload=output.payload)
        await self.network.announce(announcement)

    def route(self, verified: VerifiedAnnouncement) -> Taken:
        """File an announcement under its round (or keep it for a round not started yet).
        Its sender must be a member of the epoch as the latest coordinator state has it.
        `NOT_NOW`: not taken now (the P2P inbox forgets it, so a later copy is delivered);
        `REFUSED`: never taken (a round already over, a second Finished of its sender for its
        step, a result `accept_result` refused), so never forwarded."""
        if verified.sender not in self.ctx.members():
            return Taken.NOT_NOW
        announcement = verified.announcement
        round_ = self.ctx.round_for_step(announcement.step)
        if round_ is None or not round_.confirmed:
            current = self.ctx.current
            current_step = current.step if current is not None and current.confirmed else 0
            if announcement.step <= current_step:
                return Taken.REFUSED  # a round already over: nothing to do with it
            if self.early.holds_finished(announcement):
                return Taken.REFUSED
            return Taken.ACCEPTED if self._keep_early(verified) else Taken.NOT_NOW
        if isinstance(announcement, ResultAnnouncement):
            if announcement.sender_id == self.ctx.me:
                return Taken.ACCEPTED
            return Taken.ACCEPTED if self.accept_result(round_, announcement) else Taken.REFUSED
        if announcement.sender_id in round_.finished_from:
            return Taken.REFUSED  # one Finished per sender and step
        round_.finished_from.add(announcement.sender_id)
        round_.witness.record_announcement(announcement.data_hash)
        self.on_change()
        return Taken.ACCEPTED

    def _keep_early(self, verified: VerifiedAnnouncement) -> bool:
        coordinator = self.ctx.coordinator
        return coordinator is not None and self.early.keep(verified, coordinator)

    def replay_early(self) -> None:
        """Route the announcements kept for rounds we had not started."""
        for verified in self.early.take(self.ctx.coordinator):
            self.route(verified)

    def accept_result(
        self, round_: RoundState, announcement: ResultAnnouncement, own_payload: bytes | None = None
    ) -> bool:
        """Take a result announced for `round_` and start its download; False when it is
        refused (not a batch of the round, not its trainer's, a known commitment, a size
        other than every result's)."""
        batch = BatchId(announcement.batch_start, announcement.batch_end)
        owner = round_.roles.assignments.get(batch)
        if owner is None:
            log.warning(
                "result for %s is not a batch of step %d",
                batch,
                round_.step,
                extra=self.ctx.fields(),
            )
            return False
        if owner != announcement.sender_id:
            log.warning(
                "result for %s from %s, which is not its trainer",
                batch,
                short_id(announcement.sender_id),
                extra=self.ctx.fields(),
            )
            return False
        if not self._is_trainer(round_, announcement.sender_id):
            return False
        if (announcement.run_id, announcement.round_seed) != (
            self._run_id(),
            round_.roles.random_seed,
        ):
            log.warning(
                "result for %s from %s refused: signed for run %r, round seed %d (this round: "
                "run %r, seed %d)",
                batch,
                short_id(announcement.sender_id),
                announcement.run_id,
                announcement.round_seed,
                self._run_id(),
                round_.roles.random_seed,
                extra=self.ctx.fields(),
            )
            return False
        commitment = announcement.commitment
        if commitment in round_.downloads:
            return False
        expected = self.ctx.require_backend().result_size()
        if announcement.size != expected:
            log.warning(
                "result for %s from %s refused: it announces %d bytes, every result of this "
                "run takes exactly %d",
                batch,
                short_id(announcement.sender_id),
                announcement.size,
                expected,
                extra=self.ctx.fields(),
            )
            return False
        known = round_.candidates.setdefault(batch, [])
        for other in known:
            if other.sender == announcement.sender_id:
                self._report_equivocation(round_.downloads[other.commitment], announcement)
        download = ResultDownload(announcement, batch)
        round_.downloads[commitment] = download
        known.append(Candidate(announcement.sender_id, commitment))
        round_.witness.record_announcement(commitment)
        self.ctx.stats.result_announced()
        download.task = self.ctx.tasks.spawn(self._download(round_, download, own_payload))
        return True

    def _report_equivocation(self, first: ResultDownload, second: ResultAnnouncement) -> None:
        """Two signed commitments of one trainer for one batch: send the proof (once per
        trainer and epoch); the coordinator removes the trainer and every client skips it."""
        trainer = second.sender_id
        coordinator = self.ctx.coordinator
        epoch = coordinator.progress.epoch if coordinator is not None else 0
        log.warning(
            "%s signed two commitments for %s of step %d: reporting its equivocation",
            short_id(trainer),
            first.batch,
            second.step,
            extra=self.ctx.fields(),
        )
        if (epoch, trainer) in self._reported:
            return
        self._reported.add((epoch, trainer))
        proof = proof_of(first.announcement, second)
        self.ctx.tasks.spawn(self.uplink.send_equivocation(proof), round_scoped=False)

    def _run_id(self) -> str:
        coordinator = self.ctx.coordinator
        return coordinator.run_id if coordinator is not None else ""

    def _is_trainer(self, round_: RoundState, sender: bytes) -> bool:
        selection = round_.roles.selection
        ids = self.ctx.members()
        if selection is None or sender not in ids:
            return False
        index = ids.index(sender)
        return index < selection.total_nodes and (
            selection.get_committee(index).committee == Committee.Trainer
        )

    async def _download(
        self, round_: RoundState, download: ResultDownload, own_payload: bytes | None
    ) -> None:
        backend = self.ctx.require_backend()
        announcement, batch = download.announcement, download.batch
        sender = short_id(announcement.sender_id)
        wait = doubling(self.options.download_backoff)

        async def attempt() -> DecodedResult:
            if own_payload is not None:
                payload = own_payload
            else:
                providers = [announcement.sender_id] + [
                    peer
                    for peer in self.ctx.members()
                    if peer not in (announcement.sender_id, self.ctx.me)
                ]
                payload = await self._fetch(round_, announcement, providers)
                self.ctx.stats.downloaded(len(payload))
            return await asyncio.to_thread(
                backend.decode, round_.step, batch, payload, announcement.data_hash
            )

        def log_failure(state: RetryCallState) -> None:
            log.warning(
                "download of %s from %s failed (%s); retry in %.0fs",
                batch,
                sender,
                failure(state),
                wait(state),
                extra=self.ctx.fields(),
            )

        downloading = retrying(
            wait=wait,
            retry=retry_on(lambda exc: not isinstance(exc, ValueError)),
            attempts=DOWNLOAD_RETRIES + 1,
            after=log_failure,
        )
        try:
            result = await call(downloading, attempt)
        except ValueError as exc:
            log.warning(
                "result for %s from %s rejected: %s",
                batch,
                sender,
                exc,
                extra=self.ctx.fields(),
            )
            download.status = DownloadStatus.REJECTED
            self.on_change()
            return
        except Exception:
            log.warning(
                "giving up on the result for %s from %s after %d attempts",
                batch,
                sender,
                DOWNLOAD_RETRIES + 1,
                extra=self.ctx.fields(),
            )
            download.status = DownloadStatus.FAILED
            self.on_change()
            return
        elapsed_ms = max(1, int((time.monotonic() - round_.started_at) * 1000))
        round_.witness.record_verified(
            announcement.sender_id, batch, announcement.commitment, elapsed_ms
        )
        download.result = result
        download.status = DownloadStatus.VERIFIED
        self.on_change()

    async def _fetch(
        self, round_: RoundState, announcement: ResultAnnouncement, providers: list[bytes]
    ) -> bytes:
        """Fetch a result's blob, timed in the round's meter (`link_speed`)."""
        round_.fetches.begin()
        fetched = 0
        try:
            payload = await self.network.fetch_blob(
                announcement.blob_hash, announcement.size, providers
            )
            fetched = len(payload)
            return payload
        finally:
            round_.fetches.end(fetched)

    async def rebroadcast(self, now: float) -> None:
        """Re-send our own announcements of the last two rounds every 10 s."""
        if now - self._last_rebroadcast < REBROADCAST_INTERVAL:
            return
        self._last_rebroadcast = now
        for round_ in (self.ctx.previous, self.ctx.current):
            if round_ is not None:
                for announcement in round_.own_announcements:
                    await self.network.announce(announcement)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


__all__ = ["FinishedAnnouncement", "ResultExchange"]
