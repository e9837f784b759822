"""The parts a client is composed of, as factories with defaults: `Parts`.

`ClientApp` builds its P2P node, the round pipeline's view of it (the network), the uplink,
the training backend (a registry entry), the data fetcher and the metrics sink only through a
`Parts`, and hands the round pipeline its one policy from it: which trainers a witness
accuses (`accusation`).

`Parts` is the client's one extension point: a test or an attack client (tests/e2e/*_client.py)
changes the client only by swapping a part here, never by patching a module or through a hook
in the layers below: `ClientApp(options, parts=Parts(network=MyNetwork))`, or
`psyche_client.cli.main(obj=Parts(...))` for a whole `psyche-client` process. What a client
trains, the results it publishes included, is changed by a backend of its own in the registry
(a `DistroBackend` subclass: `Parts(backends=weights.backends.with_distro_backend(MyBackend))`);
what it sends to the server, by its uplink; what it announces and serves to peers, by its node
or network; whom it accuses as a witness, by `accusation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from psyche_common.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_common.data.fetcher import DataSource, SampleFetcher
from psyche_common.data.retry import RetryPolicy
from psyche_common.protocol import Identity

from psyche_client.metrics.factory import open_metrics_sink
from psyche_client.metrics.options import MetricsOptions
from psyche_client.metrics.sink import ClientMetricsSink
from psyche_client.p2p.node import P2PNode
from psyche_client.round.health import AccusationPolicy, clients_to_accuse
from psyche_client.round.ports import PeerNetwork
from psyche_client.session.uplink import SwitchableUplink
from psyche_client.weights.backends import BACKENDS, BackendEntry, BackendKind


class NodeNetwork:
    """Adapts `P2PNode` to the round pipeline's `PeerNetwork` protocol."""

    def __init__(self, node: P2PNode) -> None:
        self.node = node

    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None:
        await self.node.announce(announcement)

    def publish_blob(self, data: bytes, step: int) -> bytes:
        return self.node.publish_blob(data, step=step)

    async def fetch_blob(self, blob_hash: bytes, size: int, providers: Sequence[bytes]) -> bytes:
        return await self.node.fetch_blob(blob_hash, providers, expected_size=size)

    def begin_step(self, step: int) -> None:
        self.node.set_step(step)
        self.node.forget_before(step - 2)


def make_fetcher(
    source: Callable[[], DataSource], identity: Identity, policy: RetryPolicy
) -> SampleFetcher:
    """Samples of a batch from the run's data_location; its provider is built at the first
    fetch."""
    return SampleFetcher(source, identity, policy)


@dataclass(frozen=True)
class Parts:
    """Factories of a client's parts (see the module docstring)."""

    node: type[P2PNode] = P2PNode
    network: Callable[[P2PNode], PeerNetwork] = NodeNetwork
    uplink: Callable[[], SwitchableUplink] = SwitchableUplink
    backends: Mapping[BackendKind, BackendEntry] = field(default_factory=lambda: BACKENDS)
    fetcher: Callable[[Callable[[], DataSource], Identity, RetryPolicy], SampleFetcher] = (
        make_fetcher
    )
    accusation: AccusationPolicy = clients_to_accuse
    metrics: Callable[[MetricsOptions, str, str], ClientMetricsSink] = open_metrics_sink
    """(options, run id, client short id) → where the client's metrics go (blocking: run
    off the event loop; raises `metrics.sink.MetricsStartError` when it cannot start)."""
