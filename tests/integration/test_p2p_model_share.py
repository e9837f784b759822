"""Late-joiner model download from real P2P nodes on 127.0.0.1, and the benchmark function."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from psyche_client.p2p import (
    ModelManifest,
    ModelShareError,
    P2PConfig,
    P2PNode,
    download_model,
    parameter_info,
    poll_manifests,
)
from psyche_client.p2p.benchmark import measure_parameter_fetch
from psyche_common.protocol import Identity

pytestmark = pytest.mark.timeout(60)

FAST = P2PConfig(
    bind_host="127.0.0.1",
    connect_timeout=1.0,
    read_timeout=0.5,
    fetch_deadline=10.0,
    retry_backoff=0.01,
    manifest_timeout=1.0,
    max_concurrent_parameter_requests=3,
    chunk_size=64 * 1024,
)


def make_model(
    count: int = 12, size: int = 100_000, step: int = 42
) -> tuple[ModelManifest, dict[str, bytes]]:
    params = {f"model.layers.{i}.weight": os.urandom(size + i) for i in range(count)}
    manifest = ModelManifest.build(
        step=step,
        epoch=2,
        parameters=[parameter_info(n, "bfloat16", [len(b) // 2], b) for n, b in params.items()],
        config_json='{"hidden_size": 8}',
    )
    return manifest, params


class CorruptParameterNode(P2PNode):
    """Serves the right manifest but flips a byte of every parameter."""

    def _outgoing_bytes(self, kind: str, key: Any, data: bytes) -> bytes:
        if kind == "parameter":
            return bytes([data[0] ^ 1]) + data[1:]
        return data


class CountingNode(P2PNode):
    """Tracks how many parameter requests all CountingNodes handle at once."""

    active = 0
    peak = 0

    async def _handle(self, conn: Any, peer_id: bytes, request: dict[str, Any]) -> None:
        if request.get("type") != "GetParameter":
            return await super()._handle(conn, peer_id, request)
        type(self).active += 1
        type(self).peak = max(type(self).peak, type(self).active)
        try:
            await asyncio.sleep(0.05)
            await super()._handle(conn, peer_id, request)
        finally:
            type(self).active -= 1


class Swarm:
    def __init__(self) -> None:
        self.members: set[bytes] = set()
        self.nodes: list[P2PNode] = []

    async def add(
        self,
        cls: type[P2PNode] = P2PNode,
        model: tuple[ModelManifest, dict[str, bytes]] | None = None,
        holds_model: Callable[[], bool] | None = None,
        **config: Any,
    ) -> P2PNode:
        identity = Identity.generate()
        self.members.add(identity.public_key)
        get_manifest: Callable[[], ModelManifest | None] | None = None
        get_bytes: Callable[[str], bytes | None] | None = None
        if model is not None:
            manifest, params = model
            get_manifest, get_bytes = (lambda: manifest), params.get
        node = cls(
            identity,
            is_member=self.members.__contains__,
            config=dataclasses.replace(FAST, **config),
            get_manifest=get_manifest,
            get_parameter_bytes=get_bytes,
            holds_model=holds_model,
        )
        await node.start()
        self.nodes.append(node)
        book = {n.peer_id: n.address for n in self.nodes}
        for n in self.nodes:
            n.set_peers(book)
        return node


@pytest.fixture
async def swarm() -> AsyncIterator[Swarm]:
    s = Swarm()
    yield s
    for node in s.nodes:
        await node.close()


async def test_model_from_three_peers_one_corrupt_one_dead(swarm: Swarm) -> None:
    model = make_model()
    good = await swarm.add(model=model)
    corrupt = await swarm.add(CorruptParameterNode, model=model)
    dead = await swarm.add(model=model)
    joiner = await swarm.add()
    await dead.close()
    progress: list[tuple[int, int]] = []
    loaded: dict[str, bytes] = {}
    result = await download_model(
        joiner,
        [good.peer_id, corrupt.peer_id, dead.peer_id],
        on_parameter=lambda info, data: loaded.__setitem__(info.name, data),
        on_progress=lambda done, total: progress.append((done, total)),
    )
    manifest, params = model
    assert result.manifest == manifest and result.manifest.step == 42
    assert result.parameters == params == loaded
    assert sorted(result.holders) == sorted([good.peer_id, corrupt.peer_id])
    assert result.corrupt_peers == {corrupt.peer_id}
    assert set(result.sources.values()) <= {good.peer_id}
    assert progress[-1] == (12, 12) and len(progress) == 12
    assert joiner.stats.downloads.corrupt >= 1


async def test_parameters_come_from_several_peers_within_the_concurrency_bound(
    swarm: Swarm,
) -> None:
    CountingNode.active = CountingNode.peak = 0
    model = make_model(count=9, size=20_000)
    servers = [await swarm.add(CountingNode, model=model) for _ in range(3)]
    joiner = await swarm.add(max_concurrent_parameter_requests=2)
    result = await download_model(joiner, [s.peer_id for s in servers])
    assert result.parameters == model[1]
    assert len(set(result.sources.values())) == 3  # load spread over every holder
    assert CountingNode.peak == 2


async def test_majority_manifest_wins_and_dissenter_is_not_used(swarm: Swarm) -> None:
    model = make_model(count=3)
    other = make_model(count=3, step=41)
    a = await swarm.add(model=model)
    b = await swarm.add(model=model)
    liar = await swarm.add(model=other)
    joiner = await swarm.add()
    vote = await poll_manifests(joiner, [a.peer_id, b.peer_id, liar.peer_id])
    assert vote.manifest == model[0] and vote.responders == 3
    assert sorted(vote.holders) == sorted([a.peer_id, b.peer_id])
    assert "disagrees with the majority" in vote.problems[liar.peer_id]
    result = await download_model(joiner, [a.peer_id, b.peer_id, liar.peer_id])
    assert liar.peer_id not in result.sources.values()


async def test_peers_sharing_the_same_weights_at_different_steps_agree(swarm: Swarm) -> None:
    """One member shared its weights at a Cooldown, another (after a server restart) at its
    next Warmup check: the same model labelled with another step and epoch. A joiner asking
    both takes it (this was once 'no manifest has a majority ... ([1, 1])')."""
    manifest, params = make_model(count=2)
    relabelled = ModelManifest.build(
        step=manifest.step + 1,
        epoch=manifest.epoch + 1,
        parameters=manifest.parameters,
        config_json=manifest.config_json,
    )
    a = await swarm.add(model=(manifest, params))
    b = await swarm.add(model=(relabelled, params))
    joiner = await swarm.add()
    vote = await poll_manifests(joiner, [a.peer_id, b.peer_id])
    assert sorted(vote.holders) == sorted([a.peer_id, b.peer_id]) and not vote.problems
    result = await download_model(joiner, [a.peer_id, b.peer_id])
    assert result.parameters == params
    other_config = ModelManifest.build(
        step=manifest.step,
        epoch=manifest.epoch,
        parameters=manifest.parameters,
        config_json='{"hidden_size": 16}',
    )
    liar = await swarm.add(model=(other_config, params))
    with pytest.raises(ModelShareError, match="no manifest has a majority"):
        await poll_manifests(joiner, [a.peer_id, liar.peer_id])


async def test_no_majority_is_an_error(swarm: Swarm) -> None:
    a = await swarm.add(model=make_model(count=2))
    b = await swarm.add(model=make_model(count=2))
    joiner = await swarm.add()
    with pytest.raises(ModelShareError, match="no manifest has a majority"):
        await download_model(joiner, [a.peer_id, b.peer_id])


async def test_no_peer_with_a_model_is_a_clear_error(swarm: Swarm) -> None:
    empty = await swarm.add()  # holds no model: answers NotFound
    joiner = await swarm.add()
    with pytest.raises(ModelShareError, match="try joining again"):
        await download_model(joiner, [empty.peer_id])


async def test_joiner_waits_for_a_member_that_shares_its_model_late(swarm: Swarm) -> None:
    """After a server restart mid-epoch the members share their weights only once their Warmup
    weights check has run; a joiner that asks first waits for them instead of giving up."""
    manifest, params = make_model(count=2)
    ready = asyncio.Event()
    member = await swarm.add(model=(manifest, params))
    member._requests._get_manifest = lambda: manifest if ready.is_set() else None
    joiner = await swarm.add()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ModelShareError, match="does not hold it"):
        await poll_manifests(joiner, [member.peer_id])  # without a wait: at once, as before
    assert loop.time() - started < 1.0
    loop.call_later(0.5, ready.set)
    started = loop.time()
    download = await download_model(joiner, [member.peer_id], wait=10.0)
    assert download.manifest == manifest and download.parameters == params
    assert 0.5 <= loop.time() - started < 5.0


async def test_joiner_waits_for_a_late_share_only_so_long(swarm: Swarm) -> None:
    empty = await swarm.add()  # reachable, never shares a model
    joiner = await swarm.add()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ModelShareError, match="try joining again"):
        await poll_manifests(joiner, [empty.peer_id], wait=1.5)
    assert 1.5 <= loop.time() - started < 4.0
    started = loop.time()
    with pytest.raises(ModelShareError, match="try joining again"):  # unreachable: no wait
        await poll_manifests(joiner, [Identity.generate().public_key], wait=30.0)
    assert loop.time() - started < 5.0


async def test_all_holders_corrupt_fails_naming_the_parameter(swarm: Swarm) -> None:
    model = make_model(count=2)
    bad = await swarm.add(CorruptParameterNode, model=model)
    joiner = await swarm.add()
    with pytest.raises(ModelShareError, match=r"parameter 'model\.layers\.[01]\.weight'"):
        await download_model(joiner, [bad.peer_id])


async def test_benchmark_function_runs() -> None:
    figures = await measure_parameter_fetch(1.0, peers=2, parameter_count=4)
    assert figures["megabytes"] == 1.0 and figures["peers"] == 2
    assert figures["p2p_seconds"] > 0 and figures["raw_loopback_seconds"] > 0
    assert figures["ratio_p2p_over_raw"] == pytest.approx(
        figures["p2p_seconds"] / figures["raw_loopback_seconds"], rel=0.05
    )


async def test_peers_that_disagree_at_first_are_asked_again(swarm: Swarm) -> None:
    """After a server restart honest members may hold different steps until their Warmup
    weights check brings them back to one model: a joiner asks again instead of failing."""
    model, behind = make_model(count=2), make_model(count=2)
    a = await swarm.add(model=model)
    b = await swarm.add(model=behind)
    joiner = await swarm.add()
    asyncio.get_running_loop().call_later(
        0.5, setattr, b._requests, "_get_manifest", lambda: model[0]
    )
    b._requests._get_parameter_bytes = model[1].get
    vote = await poll_manifests(joiner, [a.peer_id, b.peer_id], wait=10.0)
    assert vote.manifest == model[0] and sorted(vote.holders) == sorted([a.peer_id, b.peer_id])


async def test_a_lone_answer_out_of_several_peers_is_not_trusted(swarm: Swarm) -> None:
    liar = await swarm.add(model=make_model(count=2))
    silent = await swarm.add()  # shares no model
    joiner = await swarm.add()
    with pytest.raises(ModelShareError, match="only 1 of 2 peers vouch"):
        await poll_manifests(joiner, [liar.peer_id, silent.peer_id])


async def test_a_model_over_the_size_bound_does_not_vote(swarm: Swarm) -> None:
    big = await swarm.add(model=make_model(count=2, size=10_000))
    joiner = await swarm.add(max_model_size=5_000)
    with pytest.raises(ModelShareError, match="max_model_size 5000"):
        await poll_manifests(joiner, [big.peer_id])


async def test_a_mid_epoch_joiner_takes_only_the_snapshot_of_its_step(swarm: Swarm) -> None:
    """`poll_manifests(step=)`: the members' last Cooldown model is no snapshot of the step a
    joiner needs; it waits (polling every `interval`) until they share that step's."""
    old, old_params = make_model(count=2)
    snapshot = ModelManifest.build(
        step=old.step + 5,
        epoch=old.epoch,
        parameters=old.parameters,
        config_json=old.config_json,
    )
    shared = {"manifest": old}
    members = [await swarm.add(model=(old, old_params)) for _ in range(2)]
    for member in members:
        member._requests._get_manifest = lambda: shared["manifest"]
    joiner = await swarm.add()
    peers = [m.peer_id for m in members]
    with pytest.raises(ModelShareError, match=f"not {snapshot.step}"):
        await poll_manifests(joiner, peers, step=snapshot.step)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, shared.update, {"manifest": snapshot})
    started = loop.time()
    vote = await poll_manifests(joiner, peers, step=snapshot.step, wait=5.0, interval=0.1)
    assert vote.manifest.step == snapshot.step and sorted(vote.holders) == sorted(peers)
    assert loop.time() - started < 1.5


async def test_two_liars_do_not_win_before_the_honest_members_share(swarm: Swarm) -> None:
    """Members that hold the weights but share none yet answer `NotShared`: undecided votes,
    not absent ones, so two colluders that answer at once with the same lie are no majority
    (issue 29, 10a); once the members share, their manifest wins. Peers that hold no weights
    at all (fresh joiners) still do not count, so a Warmup join needs no more than before."""
    honest, honest_params = make_model(count=2)
    lie = make_model(count=2)
    ready = asyncio.Event()
    liars = [await swarm.add(model=lie) for _ in range(2)]
    members = [
        await swarm.add(model=(honest, honest_params), holds_model=lambda: True) for _ in range(3)
    ]
    for member in members:
        member._requests._get_manifest = lambda: honest if ready.is_set() else None
    joiner = await swarm.add()
    peers = [p.peer_id for p in [*liars, *members]]
    with pytest.raises(ModelShareError, match="3 hold the weights but share none yet"):
        await poll_manifests(joiner, peers)
    asyncio.get_running_loop().call_later(0.3, ready.set)
    vote = await poll_manifests(joiner, peers, wait=5.0, interval=0.1)
    assert vote.manifest == honest
    assert sorted(vote.holders) == sorted(m.peer_id for m in members)
    # the same two against three peers that hold no weights (NotFound): trusted, as before
    empty = [await swarm.add() for _ in range(3)]
    vote = await poll_manifests(joiner, [*(p.peer_id for p in liars), *(e.peer_id for e in empty)])
    assert vote.manifest == lie[0]
