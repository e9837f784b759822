"""The round pipeline against the real coordinator, in-process (dummy backend, fake clock)."""

from __future__ import annotations

import asyncio

import pytest
from psyche_client.p2p.announcements import make_finished_announcement
from psyche_client.p2p.inbox import verify
from psyche_common.coordinator import RunState

from tests.support.client_harness import FakeServer, add_client, make_coordinator
from tests.support.fakes import MemoryHub


async def run_until(server: FakeServer, predicate, max_steps: int = 400) -> None:
    for _ in range(max_steps):
        await server.step()
        if predicate():
            return
    raise AssertionError(
        f"condition not reached; state {server.coordinator.run_state!s} "
        f"step {server.coordinator.progress.step}; errors {server.errors[-5:]}"
    )


def assert_consistent(server: FakeServer) -> None:
    for step, by_client in server.hashes.items():
        assert len(set(by_client.values())) == 1, f"weights differ at step {step}"


@pytest.mark.timeout(120)
async def test_three_clients_train_with_identical_weights() -> None:
    server = FakeServer(make_coordinator(epoch_time=12, total_steps=8))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]
    await run_until(server, lambda: server.coordinator.run_state == RunState.Finished)
    applied_steps = sorted(server.hashes)
    assert len(applied_steps) >= 3, applied_steps
    assert_consistent(server)
    assert all(len(by_client) == 3 for by_client in server.hashes.values()), server.hashes
    assert server.witness_hashes
    distinct = {next(iter(by_client.values())) for by_client in server.hashes.values()}
    assert len(distinct) >= 3, "results were not applied"
    for runner in runners:
        assert runner.fatal is None
        assert runner.stats.results_announced > 0
    assert server.accusations == []
    for runner in runners:
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_clients_with_per_client_shares_train_with_identical_weights() -> None:
    coordinator = make_coordinator(
        epoch_time=12, total_steps=8, witness_nodes=0, per_client_shares=True
    )
    server = FakeServer(coordinator)
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]
    shares_seen: list[list[int]] = []

    def finished() -> bool:
        shares = server.coordinator.current_round().shares
        if shares and shares not in shares_seen:
            shares_seen.append(list(shares))
        return server.coordinator.run_state == RunState.Finished

    await run_until(server, finished)
    assert shares_seen, "no round got shares from witnessed times"
    assert all(sum(shares) == sum(shares_seen[0]) for shares in shares_seen)
    assert any(c.rate > 0 for c in server.coordinator.epoch_state.clients)
    assert len(server.hashes) >= 3
    assert_consistent(server)
    assert server.accusations == []
    for runner in runners:
        assert runner.fatal is None
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_corrupt_relay_is_skipped_and_dead_client_is_accused() -> None:
    server = FakeServer(make_coordinator(epoch_time=40, total_steps=14, witness_nodes=0))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(4)]
    ids = list(server.runners)
    await run_until(server, lambda: server.coordinator.progress.step >= 3)
    # one peer serves corrupted blobs from now on; another dies
    hub.corrupt_from.add(ids[1])
    hub.dead.add(ids[3])
    server.pending.remove(ids[3])
    await run_until(server, lambda: server.coordinator.progress.step >= 9)
    assert hub.corrupt_served > 0
    assert any(ids[3] in accused for _, accused in server.accusations)
    alive = set(ids[:3])
    for step, by_client in server.hashes.items():
        values = {h for cid, h in by_client.items() if cid in alive}
        assert len(values) <= 1, f"survivors' weights differ at step {step}"
    for runner in runners[:3]:
        assert runner.fatal is None
    for runner in runners:
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_every_epoch_warmup_ends_by_warmup_witness() -> None:
    """Regression: a client's warmup Finished message was identical in every epoch, so the
    peers' de-duplication dropped it after epoch 0 and later Warmups ran to their timeout."""
    server = FakeServer(make_coordinator(epoch_time=8, total_steps=40))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]
    await run_until(server, lambda: server.coordinator.progress.epoch >= 3)
    epochs_with_witness = {epoch for epoch, _ in server.warmup_witnesses}
    assert {0, 1, 2} <= epochs_with_witness, server.warmup_witnesses
    for runner in runners:
        assert runner.fatal is None
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_a_dropped_client_joins_again_and_trains_in_a_later_epoch() -> None:
    """Regression: a client dropped by a health check (and kicked from the pending set) idled
    for good ("no longer in the client list"); it now joins again and is back next epoch."""
    server = FakeServer(make_coordinator(epoch_time=8, total_steps=60, witness_nodes=0))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(4)]
    victim = list(server.runners)[3]
    await run_until(server, lambda: server.coordinator.progress.step >= 3)
    server.rejoins.clear()  # the Join each client sends once it has loaded its model
    hub.dead.add(victim)  # stops delivering: the witnesses accuse it and it is dropped
    await run_until(server, lambda: victim in server.rejoins)
    assert victim in server.kicked
    hub.dead.discard(victim)  # reachable again; its new Join stands
    epoch = server.coordinator.progress.epoch
    await run_until(
        server,
        lambda: (
            server.coordinator.progress.epoch > epoch
            and victim in [c.id for c in server.coordinator.epoch_state.clients]
        ),
    )
    for runner in runners:
        await runner.aclose()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("round_witness_time", [1, 0.2])
async def test_rounds_prepared_while_witnesses_report_are_adopted(
    round_witness_time: float,
) -> None:
    server = FakeServer(
        make_coordinator(epoch_time=12, total_steps=8, round_witness_time=round_witness_time)
    )
    assert server.coordinator.config.round_witness_time == round_witness_time
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]
    await run_until(server, lambda: server.coordinator.run_state == RunState.Finished)
    assert_consistent(server)
    for runner in runners:
        assert runner.fatal is None
        # every round after the first of an epoch was known before it started
        assert runner.stats.prepared_rounds["adopt"] >= 3, runner.stats.prepared_rounds
    for runner in runners:
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_a_pause_during_the_witness_phase_undoes_the_early_apply() -> None:
    server = FakeServer(make_coordinator(epoch_time=60, total_steps=40))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]

    def prepared_everywhere() -> bool:
        coordinator = server.coordinator
        return (
            coordinator.run_state == RunState.RoundWitness
            and coordinator.progress.step >= 4
            and all(
                r.preparer.prepared is not None and r.preparer.prepared.apply_task is not None
                for r in runners
            )
        )

    await run_until(server, prepared_everywhere)
    last_confirmed = max(server.hashes)
    confirmed_hash = next(iter(server.hashes[last_confirmed].values()))
    for runner in runners:  # the early apply has happened (or is under way)
        assert runner.preparer.prepared is not None
        assert runner.preparer.prepared.apply_task is not None
        await runner.preparer.prepared.apply_task
    assert {r.backend.weights_hash() for r in runners} != {confirmed_hash}
    server.call(lambda c: c.pause(server.now))  # the round after this one never starts
    await run_until(server, lambda: server.coordinator.run_state == RunState.Cooldown)
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert {r.backend.weights_hash() for r in runners} == {confirmed_hash}
    assert max(server.hashes) == last_confirmed
    for runner in runners:
        assert runner.fatal is None
        assert runner.stats.prepared_rounds["revert"] == 1
        await runner.aclose()


@pytest.mark.timeout(120)
async def test_an_announcement_kept_for_a_prepared_round_is_filed_in_it_when_adopted() -> None:
    """Regression: an adopted round was marked confirmed only in a spawned task, after the
    announcements kept for it had been replayed; they were put back until the next round
    start, and a witness lacked a Finished message (or a result) it had long received."""
    server = FakeServer(make_coordinator(epoch_time=60, total_steps=40))
    hub = MemoryHub()
    runners = [add_client(server, hub) for _ in range(3)]
    me, peer = runners[0], runners[1]

    def prepared() -> bool:
        coordinator = server.coordinator
        return (
            coordinator.run_state == RunState.RoundWitness
            and coordinator.progress.step >= 3
            and me.preparer.prepared is not None
        )

    await run_until(server, prepared)
    assert me.preparer.prepared is not None
    step = me.preparer.prepared.round_.step
    kept = make_finished_announcement(
        peer.ctx.identity, step=step, warmup=False, broadcast_merkle=b"\x07" * 32
    )
    me.on_announcement(verify(kept))
    assert verify(kept) in me.exchange.early.kept  # the round is only predicted so far

    def started() -> bool:
        return me.ctx.current is not None and me.ctx.current.step == step

    await run_until(server, started)
    assert me.stats.prepared_rounds["adopt"] >= 1, me.stats.prepared_rounds
    assert verify(kept) not in me.exchange.early.kept
    assert peer.ctx.me in me.ctx.current.finished_from
    for runner in runners:
        await runner.aclose()
