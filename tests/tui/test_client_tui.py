"""The client dashboard, driven with Textual's pilot (no client process: views are given)."""

from __future__ import annotations

import logging

from psyche_client.tui.app import ClientDashboard, LogLines
from psyche_client.tui.view import BandwidthMeter, ClientView, DownloadRow, PeerRow
from textual.widgets import RichLog, Static, TabbedContent


def sample_view() -> ClientView:
    return ClientView(
        client_id="ab12cd34",
        run_state="RoundTrain",
        status="Training (1 batches left)",
        epoch=1,
        step=12,
        height=4,
        losses=((10, 4.5), (11, 4.1), (12, 3.9)),
        last_loss=3.9,
        tokens_per_sec=2048.0,
        efficiency=0.75,
        global_batch_tokens=2048,
        total_tokens=24576,
        my_batches=("B[96, 97]",),
        batches_left=1,
        role="Trainer + Witness",
        weights_hash="00112233aabbccdd",
        bytes_up_step=9000,
        bytes_down_step=27000,
        clients=("ab12cd34", "ffee0011"),
        data_source="Builtin(python-stdlib)",
        checkpoint="Hub builtin:llama-tiny",
        peers=(
            PeerRow("ffee0011", "127.0.0.1:4000", 0.002, 27000, 9000),
            PeerRow("77aa0022", "10.0.0.9:4000", None, 100, 50, False, "they dialed"),
            PeerRow("5e1a7e00", "10.0.0.7:4000", 0.09, 300, 200, False, "we dialed (relayed)"),
            PeerRow("0ff11e00", "10.0.0.8:4000", None, 0, 0, True, "none"),
        ),
        reachability="reachable at 127.0.0.1:4001 (seen from 127.0.0.1)",
        downloads=(DownloadRow("model parameters", 5, 20),),
        bandwidth=(100.0, 2000.0, 500.0),
        corrupt_blobs=1,
        last_checkpoint="checkpoints/run-step8",
        checkpoint_error="could not upload checkpoints/run-step12 to the Hub repo me/model: 503",
        link_status="TOO SLOW: step 11 results at 0.50 Mbit/s (30.0 s of 20 s round time; "
        "needs 0.75 Mbit/s)",
        evals=("heldout_loss: 2.5000 (step 10)", "arc_easy: 0.3100 (step 8)"),
    )


def static_text(app: ClientDashboard, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_tabs_show_the_view_and_switch_with_keys() -> None:
    lines = LogLines()
    app = ClientDashboard(client=None, log_lines=lines)
    async with app.run_test(size=(120, 40)) as pilot:
        app.render_view(sample_view())
        await pilot.pause()
        text = static_text(app, "#client-stats")
        assert "Training (1 batches left)" in text and "Step: 12" in text
        assert "Loss: 3.900" in text and "75%" in text and "00112233aabbccdd" in text
        assert "Last checkpoint: checkpoints/run-step8" in text
        assert "Checkpoint error: could not upload checkpoints/run-step12" in text
        assert "Link: TOO SLOW: step 11 results at 0.50 Mbit/s" in text
        assert "Eval heldout_loss: 2.5000 (step 10)" in text
        assert "Eval arc_easy: 0.3100 (step 8)" in text
        await pilot.press("2")
        assert app.query_one(TabbedContent).active == "coordinator"
        coordinator = static_text(app, "#coordinator-text")
        assert "Clients: 2" in coordinator and "builtin:llama-tiny" in coordinator
        await pilot.press("3")
        assert app.query_one(TabbedContent).active == "network"
        network = static_text(app, "#network-text")
        assert "ffee0011 (127.0.0.1:4000)" in network and "[ 25.0%] 5/20" in network
        assert "P2P: reachable at 127.0.0.1:4001 (seen from 127.0.0.1)" in network
        assert "Link speed: TOO SLOW: step 11 results at 0.50 Mbit/s (30.0 s of 20 s" in network
        assert "77aa0022 (10.0.0.9:4000) outbound only, direct, they dialed" in network
        assert "5e1a7e00 (10.0.0.7:4000) outbound only, relayed, we dialed: down" in network
        assert "0ff11e00 (10.0.0.8:4000) reachable, no connection" in network
        lines.emit(logging.LogRecord("psyche.client", logging.INFO, "x", 1, "hello log", (), None))
        app.refresh_view()
        await pilot.press("4")
        assert app.query_one(TabbedContent).active == "logs"
        assert app.query_one("#log", RichLog).lines


def test_run_state_text() -> None:
    from psyche_client.tui.view import run_state_text
    from psyche_common.coordinator import Coordinator, RunState

    from tests.support.coordinators import coordinator_in, ids

    def coordinator(state: RunState, clients: int = 3) -> Coordinator:
        """`state` of epoch 1 (the previous epoch's `clients` members are listed while
        waiting); 3 members needed, Warmup 30 s, Cooldown 5 s."""
        return coordinator_in(
            state, ids(clients), epoch=1, min_clients=3, warmup_time=30, cooldown_time=5
        )

    def ten_seconds_in(coord: Coordinator) -> int:
        return coord.run_state_start_unix_timestamp + 10

    waiting = coordinator(RunState.WaitingForMembers, clients=1)
    assert run_state_text(waiting, 10) == "Waiting for 2 members"
    warmup = coordinator(RunState.Warmup)
    assert run_state_text(warmup, ten_seconds_in(warmup)) == "Warmup (20s remaining)"
    cooldown = coordinator(RunState.Cooldown)
    assert run_state_text(cooldown, ten_seconds_in(cooldown)) == "Cooldown (0s remaining)"
    assert run_state_text(coordinator(RunState.RoundWitness), 1) == "Witnessing"


def test_bandwidth_meter_samples_once_a_second() -> None:
    meter = BandwidthMeter()
    meter.sample(0, now=0.0)
    meter.sample(500, now=0.5)  # too early: ignored
    meter.sample(2000, now=1.0)
    meter.sample(2000, now=2.0)
    assert list(meter.samples) == [2000.0, 0.0]


async def test_dashboard_follows_a_live_run(tmp_path) -> None:
    """A real server process and two in-process dummy clients, one shown in the dashboard."""
    import asyncio

    from psyche_client.app import ClientApp, ClientOptions, ServerOptions
    from psyche_client.app.options import client_p2p_config
    from psyche_client.weights.backends import BackendOptions
    from psyche_common.protocol import Identity

    from bench.harness.client_run import Cluster, write_state

    cluster = Cluster(
        tmp_path, write_state(tmp_path / "state.toml", init_min_clients=2, total_steps=6)
    )
    cluster.start_server()
    try:
        apps = [
            ClientApp(
                ClientOptions(
                    ServerOptions(f"127.0.0.1:{cluster.port}", "e2e-run"),
                    Identity.generate(),
                    p2p=client_p2p_config(bind_host="127.0.0.1", advertise_host="127.0.0.1"),
                    backend=BackendOptions(dummy_delay_secs=0.1),
                )
            )
            for _ in range(2)
        ]
        other = asyncio.create_task(apps[1].run())
        dashboard = ClientDashboard(apps[0], LogLines())
        async with dashboard.run_test(size=(120, 40)) as pilot:
            for _ in range(600):
                await pilot.pause(0.1)
                if dashboard.view.step >= 4 and dashboard.view.losses:
                    break
            view = dashboard.view
            assert view.step >= 4, view
            assert view.clients and len(view.clients) == 2
            assert view.weights_hash
            assert "Step:" in static_text(dashboard, "#client-stats")
            assert len(view.peers) == 1
        other.cancel()
        await asyncio.gather(other, return_exceptions=True)
    finally:
        cluster.stop()


def test_view_of_a_client_reconnecting_with_a_result_download_in_flight() -> None:
    """Regression: a result download in flight crashed the view (it expected asyncio tasks);
    and while the server is away the status says the client is reconnecting."""
    import time

    from psyche_client.app import ClientApp, ClientOptions, ServerOptions
    from psyche_client.training.backend import DummyResult
    from psyche_client.tui.view import build_view
    from psyche_common.batch_id import BatchId
    from psyche_common.protocol import Identity

    from tests.support.rounds import downloaded, observer_round
    from tests.support.runners import lone_runner

    identity = Identity.generate()
    app = ClientApp(ClientOptions(ServerOptions("127.0.0.1:1", "r"), identity))
    trainer = b"t" * 32
    pending = downloaded(b"\xaa" * 32, trainer, BatchId(0, 3), size=4096)
    done = downloaded(b"\xbb" * 32, trainer, BatchId(4, 7), DummyResult(b""), size=1)
    round_ = observer_round(5, {BatchId(0, 3): trainer, BatchId(4, 7): trainer})
    round_.downloads = {b"\xaa" * 32: pending, b"\xbb" * 32: done}
    assert round_.batches_left == 0
    app.runner = lone_runner(identity, stats=app.stats)
    app.runner.ctx.current = round_
    status = app.server.status
    status.connected, status.attempt = False, 3
    status.lost_at, status.next_attempt_at = time.monotonic() - 5, time.monotonic() + 4.2
    view = build_view(app.snapshot(), BandwidthMeter())
    assert [(row.label, row.total) for row in view.downloads] == [("result " + "aa" * 6, 4096)]
    assert view.status.startswith("Server reconnecting (attempt 3, next in ")
