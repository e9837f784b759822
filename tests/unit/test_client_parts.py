"""A part swapped through `Parts` is what the client's round pipeline uses: the accusation
policy a witness's health check runs, and the hook that replaces our result before it is
published (the seams the attack clients in tests/e2e use instead of patching modules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from psyche_client.app import ClientApp, ClientOptions, ServerOptions
from psyche_client.app.parts import Parts
from psyche_client.round.consensus import BloomLike
from psyche_client.round.context import RoundContext
from psyche_client.round.health import clients_to_accuse
from psyche_client.round.state import RoundState
from psyche_client.training.backend import DummyBackend, TrainedResult, result_commitment
from psyche_client.weights.backends import BackendOptions
from psyche_common.batch_id import BatchId
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.protocol import Identity

from tests.support.coordinators import ids, make_coordinator, to_round_train, witness_round
from tests.support.fakes import MemoryNetwork, lone_network
from tests.support.rounds import observer_round


def make_app(parts: Parts, identity: Identity) -> ClientApp:
    options = ClientOptions(
        ServerOptions("127.0.0.1:1", "run"), identity, backend=BackendOptions(dummy_delay_secs=0)
    )
    return ClientApp(options, parts)


class RecordingPolicy:
    """An accusation policy that accuses the first trainer and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[bytes]] = []

    def __call__(
        self,
        client_ids: Sequence[bytes],
        is_trainer: Callable[[int], bool],
        participant_blooms: Sequence[BloomLike],
        quorum: int,
        proof_for: Callable[[int], CommitteeProof],
    ) -> list[tuple[bytes, CommitteeProof]]:
        trainers = [i for i in range(len(client_ids)) if is_trainer(i)]
        self.asked.append([client_ids[i] for i in trainers])
        return [(client_ids[trainers[0]], proof_for(trainers[0]))]


async def test_the_accusation_policy_given_in_parts_runs_the_health_check() -> None:
    coordinator = make_coordinator(witness_nodes=0)
    members = ids(4)
    now = witness_round(coordinator, to_round_train(coordinator, members))
    witness_round(coordinator, now, seen=[])  # nobody saw any trainer of the previous round
    policy = RecordingPolicy()
    app = make_app(Parts(accusation=policy), Identity.generate())
    runner = app.make_runner()
    runner.backend = DummyBackend(0.0)
    runner.ctx.coordinator = coordinator

    await runner.witnessing.send_health_checks(coordinator)

    assert len(policy.asked) == 1 and policy.asked[0]
    assert set(policy.asked[0]) <= set(members)
    assert app.server.uplink.dropped == 1  # its accusation went to the (unconnected) uplink


def test_the_honest_parts_accuse_with_the_honest_policy() -> None:
    app = make_app(Parts(), Identity.generate())
    assert app.make_runner().witnessing.accuse is clients_to_accuse
    assert app.make_runner().exchange.before_publish is None


async def test_the_publish_hook_given_in_parts_replaces_our_result() -> None:
    identity = Identity.generate()
    network = lone_network(identity.public_key)
    batch = BatchId(0, 3)
    other = b"o" * DummyBackend.PAYLOAD_SIZE
    replaced = TrainedResult(1.0, other, result_commitment(3, batch, other), tokens=4)
    seen: list[TrainedResult] = []

    async def replace_result(
        _ctx: RoundContext, _round: RoundState, _batch: BatchId, output: TrainedResult
    ) -> TrainedResult:
        seen.append(output)
        return replaced

    def network_of(_node: object) -> MemoryNetwork:
        return network

    app = make_app(Parts(network=network_of, before_publish=replace_result), identity)
    runner = app.make_runner()
    runner.backend = DummyBackend(0.0)
    runner.ctx.coordinator = make_coordinator()  # the run a commitment names
    round_ = observer_round(3, {batch: b"t" * 32})
    mine = b"m" * DummyBackend.PAYLOAD_SIZE
    honest = TrainedResult(1.0, mine, result_commitment(3, batch, mine), tokens=4)

    await runner.exchange.publish(round_, batch, honest)

    assert seen == [honest]
    [announcement] = network.announced
    assert announcement.data_hash == replaced.data_hash
    assert network.hub.blobs[identity.public_key][announcement.blob_hash] == other


async def test_the_metrics_sink_given_in_parts_is_opened_and_closed() -> None:
    """`Parts.metrics` builds the sink with the options, run id and short id; a sink that
    cannot start stops the client at once (exit 1) before it connects anywhere."""
    from psyche_client.metrics.options import MetricsOptions
    from psyche_client.metrics.sink import MetricsStartError, NullSink

    asked: list[tuple[MetricsOptions, str, str]] = []

    class ClosingSink(NullSink):
        closed = False

        def close(self) -> None:
            ClosingSink.closed = True

    def refuse(options: MetricsOptions, run_id: str, client: str) -> NullSink:
        asked.append((options, run_id, client))
        raise MetricsStartError("no credentials")

    identity = Identity.generate()
    app = make_app(Parts(metrics=refuse), identity)
    assert await app.run() == 1
    assert asked == [(MetricsOptions(), "run", identity.short_id)]
    assert app.runner is None  # never connected

    app = make_app(Parts(metrics=lambda *_: ClosingSink()), identity)
    assert await app.run() == 1  # nothing listens at 127.0.0.1:1
    assert isinstance(app.metrics.sink, ClosingSink) and ClosingSink.closed
