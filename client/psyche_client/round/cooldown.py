"""The Cooldown step of the round pipeline (reference §2.12): hand the model to the app's
Cooldown hook (share it with late joiners, save and upload a checkpoint) under the model
lock, as a long-lived task that survives the end of the epoch's rounds."""

from __future__ import annotations

import asyncio

from psyche_common.coordinator import Coordinator

from psyche_client.round.context import RoundContext
from psyche_client.round.ports import CooldownHook


class CooldownStep:
    def __init__(self, ctx: RoundContext, hook: CooldownHook | None) -> None:
        self.ctx = ctx
        self.hook = hook

    def start(self, coordinator: Coordinator, after: asyncio.Task[None] | None = None) -> None:
        """Run the hook once `after` (undoing a round prepared in vain) is done."""
        if self.hook is not None and self.ctx.backend is not None:
            self.ctx.tasks.spawn(self._run(coordinator, after), round_scoped=False)

    async def _run(self, coordinator: Coordinator, after: asyncio.Task[None] | None) -> None:
        assert self.hook is not None
        if after is not None:
            await after
        backend = self.ctx.require_backend()
        async with self.ctx.model_lock:
            await self.hook(coordinator, backend)
