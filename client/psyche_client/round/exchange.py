"""Result exchange of the round pipeline (reference §2.5.5, §2.6).

Publishing our results (blob + signed announcement), checking peers' announcements (member,
trainer of the round, assignee of the batch, new hash), downloading each result from its
trainer or any peer that holds it, verifying it against its signed commitment and recording
it in the round's blooms; early announcements (for a round we have not started yet) are kept
and replayed; our own announcements are re-sent every 10 s.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from psyche_common.assignment import BatchId
from psyche_common.client_id import short_id
from psyche_common.committee import Committee

from psyche_client.p2p.announcements import (
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    make_result_announcement,
    verify_announcement,
)
from psyche_client.round.base import RunnerBase
from psyche_client.round.consensus import Candidate
from psyche_client.round.state import RoundState

DOWNLOAD_RETRIES = 3
REBROADCAST_INTERVAL = 10.0
MAX_EARLY_ANNOUNCEMENTS = 4096

log = logging.getLogger("psyche.client")


class ResultExchange(RunnerBase):
    """Announcements and result downloads; mixed into `RoundRunner`."""

    async def _publish(self, round_: RoundState, batch: BatchId, output: Any) -> None:
        blob_hash = self.network.publish_blob(output.payload, round_.step)
        announcement = make_result_announcement(
            self.identity,
            step=round_.step,
            batch_start=batch.start,
            batch_end=batch.end,
            data_hash=output.data_hash,
            blob_hash=blob_hash,
            size=len(output.payload),
        )
        if self.options.write_gradients_dir is not None:
            directory = self.options.write_gradients_dir
            name = (
                f"result-{short_id(self.me)}-step{round_.step}-batch{batch.start}-{batch.end}.bin"
            )
            await asyncio.to_thread(_write_file, directory / name, output.payload)
        round_.own_announcements.append(announcement)
        self._accept_result(round_, announcement, own_payload=output.payload)
        await self.network.announce(announcement)

    def on_announcement(self, announcement: Any) -> None:
        """A verified-or-not announcement arrived from a peer (or was re-broadcast)."""
        try:
            verify_announcement(announcement)
        except AnnouncementError as exc:
            log.warning("dropped announcement: %s", exc, extra=self._fields())
            return
        if isinstance(announcement, FinishedAnnouncement) and announcement.warmup:
            self.warmup_ready.record(announcement.broadcast_merkle, announcement.sender_id)
            return
        if self.backend is None or self.coordinator is None:
            return
        self._route(announcement)

    def _route(self, announcement: Any) -> None:
        if announcement.sender_id not in self._client_ids():
            return
        round_ = self._round_for_step(announcement.step)
        if round_ is None:
            current_step = self.current.step if self.current else 0
            if announcement.step > current_step and len(self._early) < MAX_EARLY_ANNOUNCEMENTS:
                self._early.append(announcement)
            return
        if isinstance(announcement, ResultAnnouncement):
            if announcement.sender_id != self.me:
                self._accept_result(round_, announcement)
        else:
            if announcement.sender_id not in round_.finished_from:
                round_.finished_from.add(announcement.sender_id)
                round_.witness.record_announcement(announcement.data_hash)
                self._poke()

    def _accept_result(
        self, round_: RoundState, announcement: ResultAnnouncement, own_payload: bytes | None = None
    ) -> None:
        batch = BatchId(announcement.batch_start, announcement.batch_end)
        owner = round_.roles.assignments.get(batch)
        if owner is None:
            log.warning(
                "result for %s is not a batch of step %d", batch, round_.step, extra=self._fields()
            )
            return
        if owner != announcement.sender_id:
            log.warning(
                "result for %s from %s, which is not its trainer",
                batch,
                short_id(announcement.sender_id),
                extra=self._fields(),
            )
            return
        if not self._sender_is_trainer(round_, announcement.sender_id):
            return
        if announcement.data_hash in round_.announcements:
            return
        round_.announcements[announcement.data_hash] = announcement
        round_.candidates.setdefault(batch, []).append(
            Candidate(announcement.sender_id, announcement.data_hash)
        )
        round_.witness.record_announcement(announcement.data_hash)
        self.stats.result_announced()
        round_.downloads[announcement.data_hash] = self._spawn(
            self._download(round_, announcement, batch, own_payload)
        )

    def _sender_is_trainer(self, round_: RoundState, sender: bytes) -> bool:
        selection = round_.roles.selection
        ids = self._client_ids()
        if selection is None or sender not in ids:
            return False
        index = ids.index(sender)
        return index < selection.total_nodes and (
            selection.get_committee(index).committee == Committee.Trainer
        )

    async def _download(
        self,
        round_: RoundState,
        announcement: ResultAnnouncement,
        batch: BatchId,
        own_payload: bytes | None,
    ) -> None:
        assert self.backend is not None
        for attempt in range(DOWNLOAD_RETRIES + 1):
            try:
                if own_payload is not None:
                    payload = own_payload
                else:
                    providers = [announcement.sender_id] + [
                        peer
                        for peer in self._client_ids()
                        if peer not in (announcement.sender_id, self.me)
                    ]
                    payload = await self.network.fetch_blob(
                        announcement.blob_hash, announcement.size, providers
                    )
                    self.stats.downloaded(len(payload))
                decoded = await asyncio.to_thread(
                    self.backend.decode, round_.step, batch, payload, announcement.data_hash
                )
            except asyncio.CancelledError:
                raise
            except ValueError as exc:
                log.warning(
                    "result for %s from %s rejected: %s",
                    batch,
                    short_id(announcement.sender_id),
                    exc,
                    extra=self._fields(),
                )
                round_.failed.add(announcement.data_hash)
                return
            except Exception as exc:
                delay = self.options.download_backoff * 2**attempt
                log.warning(
                    "download of %s from %s failed (%s); retry in %.0fs",
                    batch,
                    short_id(announcement.sender_id),
                    exc,
                    delay,
                    extra=self._fields(),
                )
                if attempt < DOWNLOAD_RETRIES:
                    await asyncio.sleep(delay)
                continue
            round_.witness.record_verified(announcement.sender_id, batch, announcement.data_hash)
            round_.payloads[announcement.data_hash] = decoded
            self._poke()
            return
        log.warning(
            "giving up on the result for %s from %s after %d attempts",
            batch,
            short_id(announcement.sender_id),
            DOWNLOAD_RETRIES + 1,
            extra=self._fields(),
        )
        round_.failed.add(announcement.data_hash)

    async def _rebroadcast(self, now: float) -> None:
        if now - self._last_rebroadcast < REBROADCAST_INTERVAL:
            return
        self._last_rebroadcast = now
        for round_ in (self.previous, self.current):
            if round_ is None:
                continue
            for announcement in round_.own_announcements:
                await self.network.announce(announcement)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
