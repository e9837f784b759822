"""Announcements for rounds a client has not started (docs/security.md finding 4), in process:
the real P2P inbox in front of the real round runner.

Before, one member's 4096 signed far-future announcements filled every client's early list
for good; legitimate early announcements were then dropped, and, already marked seen by the
P2P layer, never delivered again. Now only the next `EARLY_STEPS` steps are kept, at most
`EARLY_PER_SENDER` per sender, the list is cleared when the epoch changes, and whatever is not
kept is forgotten by the inbox too, so a later copy is taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from psyche_client.p2p.announcements import (
    Announcement,
    FinishedAnnouncement,
    make_finished_announcement,
    make_result_announcement,
    to_wire,
)
from psyche_client.p2p.inbox import AnnouncementInbox
from psyche_client.round.early import EARLY_PER_SENDER, EARLY_STEPS
from psyche_client.round.runner import RoundRunner
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in
from tests.support.rounds import observer_round
from tests.support.runners import lone_runner

STEP = 4
ATTACKER, HONEST, ME = Identity.generate(), Identity.generate(), Identity.generate()
MEMBERS = [ATTACKER.public_key, HONEST.public_key, ME.public_key]


def result(sender: Identity, step: int, batch: int) -> Announcement:
    return make_result_announcement(
        sender,
        run_id="test",  # the run and round seed of `coordinator_in` and `observer_round`
        round_seed=0,
        step=step,
        batch_start=batch,
        batch_end=batch,
        data_hash=bytes(32),
        blob_hash=bytes(32),
        size=8,
    )


def finished(sender: Identity, step: int, salt: int = 0) -> FinishedAnnouncement:
    return make_finished_announcement(
        sender, step=step, warmup=False, broadcast_merkle=salt.to_bytes(32, "big")
    )


@dataclass
class Client:
    runner: RoundRunner
    inbox: AnnouncementInbox

    async def push(self, announcement: Announcement) -> str:
        receipt = await self.inbox.receive(announcement.sender_id, to_wire(announcement))
        return receipt.status

    def kept(self) -> list[Announcement]:
        return [v.announcement for v in self.runner.exchange.early.kept]

    def at(self, step: int, epoch: int = 0) -> None:
        """The latest coordinator state is RoundTrain of `step`; this client is in it."""
        self.runner.ctx.coordinator = coordinator_in(
            RunState.RoundTrain, MEMBERS, step=step, epoch=epoch
        )
        self.runner.ctx.current = observer_round(step, {})


def client() -> Client:
    runner = lone_runner(ME)
    inbox = AnnouncementInbox(
        set(MEMBERS).__contains__, lambda v, _peer: runner.on_announcement(v), max_seen=100_000
    )
    made = Client(runner, inbox)
    made.at(STEP)
    return made


async def test_far_future_announcements_do_not_crowd_out_the_next_steps() -> None:
    c = client()
    flood = [finished(ATTACKER, 1000 + i) for i in range(4096)]
    statuses = {await c.push(announcement) for announcement in flood}
    assert statuses == {"deferred"}
    assert c.runner.exchange.early.by_sender()[ATTACKER.public_key] == 0
    legit = finished(HONEST, STEP + 1)
    assert await c.push(legit) == "accepted"
    assert legit in c.kept()
    # filed in its round once that round starts
    c.at(STEP + 1)
    c.runner.exchange.replay_early()
    assert c.kept() == []
    assert c.runner.ctx.current is not None
    assert HONEST.public_key in c.runner.ctx.current.finished_from


async def test_each_sender_keeps_one_finished_per_step_and_at_most_its_quota() -> None:
    c = client()
    spam = [finished(ATTACKER, STEP + 1 + i % EARLY_STEPS, salt=i) for i in range(50)]
    statuses = [await c.push(announcement) for announcement in spam]
    # one Finished per sender and step; the others are refused (never forwarded)
    assert statuses.count("accepted") == EARLY_STEPS
    assert statuses.count("rejected") == 50 - EARLY_STEPS
    results = [result(ATTACKER, STEP + 1, batch=i) for i in range(50)]
    statuses = [await c.push(announcement) for announcement in results]
    assert statuses.count("accepted") == EARLY_PER_SENDER - EARLY_STEPS
    assert statuses.count("deferred") == 50 - (EARLY_PER_SENDER - EARLY_STEPS)
    legit = finished(HONEST, STEP + 1)
    assert await c.push(legit) == "accepted" and legit in c.kept()


async def test_an_announcement_not_kept_is_taken_when_it_comes_again() -> None:
    """Nothing already seen is lost: what the early buffer does not keep is not marked seen
    by the inbox, so the trainer's re-announcement (every 10 s) is delivered."""
    c = client()
    ahead = finished(HONEST, STEP + EARLY_STEPS + 1)
    assert await c.push(ahead) == "deferred"
    assert c.kept() == []
    c.at(STEP + 1)  # the run moved on: that step is within reach now
    assert await c.push(ahead) == "accepted"
    assert ahead in c.kept()
    assert await c.push(ahead) == "duplicate"


async def test_the_early_list_is_cleared_when_the_epoch_changes() -> None:
    c = client()
    kept = finished(HONEST, STEP + 1)
    assert await c.push(kept) == "accepted" and kept in c.kept()
    c.at(STEP + 1, epoch=1)
    c.runner.exchange.replay_early()
    assert c.kept() == [] and c.runner.ctx.current is not None
    assert HONEST.public_key not in c.runner.ctx.current.finished_from
