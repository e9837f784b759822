"""The server's run metrics from live protocol clients (in process): witnesses the coordinator
accepts are counted under the server's step, a witness it refuses counts for nothing, and the
snapshot the exporters read (`metrics_board`) follows the run."""

from __future__ import annotations

from pathlib import Path

from psyche_common.bloom import Bloom
from psyche_common.coordinator import RunState
from psyche_common.coordinator.types import Witness, WitnessProof
from psyche_common.protocol.messages import Witness as WitnessMessage
from psyche_common.protocol.messages import WitnessMetadata

from bench.harness.protocol_client import ProtocolClient, start_clients
from tests.support.server_harness import poll_until, running_server, write_state


async def test_accepted_witnesses_are_counted_and_a_refused_one_is_not(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=1)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id)
        await poll_until(lambda: app.metrics.latest() is not None, timeout=30)
        latest = app.metrics.latest()
        assert latest is not None and latest.loss == 1.0  # what the protocol clients report
        assert latest.reports >= 1
        # the board is republished by the tick that follows the witness (one tick behind)
        await poll_until(lambda: app.metrics_board.read().latest is not None, timeout=10)
        assert app.metrics_board.read().members == 2

        # a joined non-member's witness: the coordinator refuses it, the metrics ignore it
        outsider = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await poll_until(lambda: app.run_state == RunState.RoundTrain, timeout=30)
        reports = app.metrics.witness_reports_total
        errors = app.stats.coordinator_errors
        lie = Witness(
            proof=WitnessProof(position=0, index=0, witness=True),
            participant_bloom=Bloom.random(),
            broadcast_bloom=Bloom.random(),
        )
        step = app.coordinator.progress.step
        await outsider.send(
            WitnessMessage(witness=lie.to_wire(), metadata=WitnessMetadata(step=step, loss=1e9))
        )
        await poll_until(lambda: app.stats.coordinator_errors > errors, timeout=10)
        assert app.metrics.witness_reports_total == reports
        assert all(s.loss != 1e9 for s in app.metrics.steps())
        for client in [*clients, outsider]:
            await client.close()
