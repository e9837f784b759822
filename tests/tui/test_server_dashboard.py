"""The server dashboard, driven headless with Textual's pilot."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from psyche_common.coordinator import RunState
from psyche_common.data.local import LocalDataProvider
from psyche_server.app import ServerApp, ServerOptions
from psyche_server.data_server import DataServer
from psyche_server.tui.app import ServerDashboard
from psyche_server.tui.view_model import build_view, run_state_text
from textual.widgets import Static, TabbedContent
from textual_plotext import PlotextPlot

from tests.support.server_harness import load_coordinator, write_state


def text_of(dashboard: ServerDashboard, widget_id: str) -> str:
    return str(dashboard.query_one(f"#{widget_id}", Static).render())


async def make_server(tmp_path: Path, data_server: DataServer | None = None) -> ServerApp:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=7)
    app = ServerApp(
        load_coordinator(state), ServerOptions(host="127.0.0.1"), data_server=data_server
    )
    await app.start()
    return app


async def test_tabs_keys_pause_resume_and_quit(tmp_path: Path) -> None:
    server = await make_server(tmp_path)
    dashboard = ServerDashboard(server, refresh_interval=0.05)
    try:
        async with dashboard.run_test(size=(140, 40)) as pilot:
            await pilot.pause()
            assert text_of(dashboard, "address") == server.address
            assert text_of(dashboard, "run-id") == server.run_id
            assert text_of(dashboard, "run-state") == "Waiting for 2 members"
            assert text_of(dashboard, "pause-hint") == "Ctrl + P to pause"
            assert "Clients: 0 (0 exited)" in text_of(dashboard, "coordinator-info")

            tabs = dashboard.query_one(TabbedContent)
            for key, tab in (
                ("2", "coordinator"),
                ("3", "data"),
                ("4", "logs"),
                ("1", "dashboard"),
            ):
                await pilot.press(key)
                assert tabs.active == tab
            await pilot.press("9")  # beyond the tabs: ignored
            assert tabs.active == "dashboard"

            await pilot.press("2")
            assert "Model checkpoint: Dummy" in text_of(dashboard, "coord-config")
            await pilot.press("3")
            assert "no data :(" in text_of(dashboard, "data-stats")

            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            assert server.run_state == RunState.Paused
            assert text_of(dashboard, "pause-hint") == "Ctrl + P to resume"
            assert text_of(dashboard, "run-state") == "Paused"
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            assert server.run_state == RunState.WaitingForMembers

            logging.getLogger("psyche.server").warning("a line for the Logs tab")
            await pilot.press("4")
            await pilot.pause(0.15)
            assert any("a line for the Logs tab" in line for line in dashboard.log_buffer.lines)

            await pilot.press("q")
        assert dashboard.return_code is not None or not dashboard.is_running
    finally:
        await server.close()


async def test_pending_pause_and_countdowns(tmp_path: Path) -> None:
    server = await make_server(tmp_path)
    try:
        coordinator = server.coordinator
        for key in (b"\x01" * 32, b"\x02" * 32):
            server.pending[key] = None
        coordinator.tick(list(server.pending), 1000, 7)
        assert coordinator.run_state == RunState.Warmup
        assert run_state_text(coordinator, 2, 1003) == "Warmup (4s remaining)"
        assert run_state_text(coordinator, 2, 2000) == "Warmup (0s remaining)"
        coordinator.tick(list(server.pending), 1008, 7)
        assert coordinator.run_state == RunState.RoundTrain
        server.toggle_pause()
        view = build_view(server, 1009)
        assert view.pause_hint == "Pending pause..."
        assert view.run_state == "Training"
        assert view.next_round_clients == ["01010101", "02020202"]
        assert view.clients_line == "Clients: 2 (0 exited)"
        coordinator.withdraw(1)
        coordinator.move_clients_to_exited(0)
        view = build_view(server, 1010)
        assert view.exited_clients == ["02020202 Withdrawn at height 0"]
        assert view.clients_this_round == ["01010101 Healthy"]
        server.reachability.reachable[b"\x01" * 32] = False  # its P2P address failed the check
        view = build_view(server, 1010)
        assert view.clients_this_round == ["01010101 Healthy (P2P outbound only)"]
    finally:
        await server.close()


async def test_data_server_tab(tmp_path: Path) -> None:
    token_dir = tmp_path / "tokens"
    token_dir.mkdir()
    np.arange(10 * 16 + 1, dtype="<u2").tofile(token_dir / "a.bin")
    data_server = DataServer(
        LocalDataProvider(token_dir, "TwoBytes", 16), "127.0.0.1", 0, run_id="dash"
    )
    server = await make_server(tmp_path, data_server)
    data_server.served[b"\xab" * 32] = 4
    dashboard = ServerDashboard(server, refresh_interval=0.05)
    try:
        async with dashboard.run_test(size=(140, 40)) as pilot:
            await pilot.press("3")
            await pilot.pause(0.1)
            assert text_of(dashboard, "data-stats") == "Total samples: 10\nProvided samples: 4"
            assert f"[{'ab' * 32}]: 4" in text_of(dashboard, "data-clients")
            assert "Clients: 1" in text_of(dashboard, "data-state")
            assert dashboard.last_view is not None and dashboard.last_view.data is not None
            assert dashboard.last_view.data.fraction_given_out == 0.4
            await pilot.press("q")
    finally:
        await server.close()


def test_the_verification_line_shows_the_convictions(tmp_path: Path) -> None:
    from psyche_common.batch_id import BatchId
    from psyche_common.coordinator import Conviction
    from psyche_server.tui.view_model import verification_line

    coordinator = load_coordinator(write_state(tmp_path / "s.toml", init_min_clients=2))
    assert verification_line(coordinator) == "Verification: 0%, no conviction"
    coordinator.verification.convictions.append(
        Conviction(0, 7, bytes.fromhex("0a1b2c3d") + bytes(28), BatchId(4, 5), (b"v" * 32,), 20)
    )
    assert verification_line(coordinator) == (
        "Verification: 0%, 1 conviction (last: 0a1b2c3d at step 7, agreement 0.02)"
    )


async def test_the_relay_line_and_relayed_bytes_per_client(tmp_path: Path) -> None:
    from psyche_server.tui.view_model import relay_line

    server = await make_server(tmp_path)
    try:
        assert server.relay is not None and server.relay.port is not None
        assert relay_line(server.relay) == (
            f"Relay: port {server.relay.port}, 0 pipe(s) open, 0.0 MB forwarded (cap 100 Mbit/s)"
        )
        server.relay.stats.sent[b"a" * 32] += 2_500_000
        assert "2.5 MB forwarded" in relay_line(server.relay)
        assert relay_line(None) == "Relay: off (--no-relay)"
        assert "Relay: port" in build_view(server, 0).relay_line
    finally:
        await server.close()


async def test_loss_and_throughput_charts_follow_the_witness_reports(tmp_path: Path) -> None:
    server = await make_server(tmp_path)
    dashboard = ServerDashboard(server, refresh_interval=0.05)
    try:
        async with dashboard.run_test(size=(140, 50)) as pilot:
            await pilot.pause(0.1)
            assert dashboard.last_view is not None
            assert dashboard.last_view.charts.losses == ()
            loss_plot = dashboard.query_one("#loss-plot", PlotextPlot)
            assert "no witness reports yet" in loss_plot.plt.build()
            for step, losses in ((1, (3.0, 3.2, 50.0)), (2, (2.5, 2.7, 2.6))):
                for n, loss in enumerate(losses):
                    server.metrics.record_witness(step, bytes([n]) * 32, loss, 100.0 + n, None)
            await pilot.pause(0.15)
            charts = dashboard.last_view.charts
            assert charts.losses == ((1, 3.2), (2, 2.6))  # medians: the outlier does not show
            assert charts.tokens_per_sec == ((1, 101.0), (2, 101.0))
            assert "no witness reports yet" not in loss_plot.plt.build()
            throughput = dashboard.query_one("#throughput-plot", PlotextPlot)
            assert "Tokens/s per client" in throughput.plt.build()
            evals = str(dashboard.query_one("#evals", Static).render())
            assert "no eval scores reported" in evals
            for n, score in enumerate((0.25, 0.5, 0.75)):
                server.metrics.record_witness(3, bytes([n]) * 32, 2.0, 1.0, None, {"piqa": score})
            await pilot.pause(0.15)
            evals = str(dashboard.query_one("#evals", Static).render())
            assert "piqa: 0.5000 (step 3)" in evals
            await pilot.press("q")
    finally:
        await server.close()
