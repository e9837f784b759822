"""The client dashboard (Textual): Client, Coordinator, Network and Logs tabs.

`run_dashboard(options)` runs the client inside the Textual app (a worker on the
same event loop) and returns its exit code. Keys: 1–4 switch tabs, q quits.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from typing import TYPE_CHECKING, ClassVar, Protocol

from psyche_common.logs import ConsoleFormatter
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, RichLog, Static, TabbedContent, TabPane
from textual_plotext import PlotextPlot

from psyche_client.tui.view import (
    RELAYED,
    BandwidthMeter,
    ClientView,
    build_view,
    format_bytes,
    format_count,
)

if TYPE_CHECKING:
    from psyche_client.app.options import ClientOptions
    from psyche_client.app.parts import Parts
    from psyche_client.app.snapshot import ClientSnapshot

REFRESH_SECONDS = 0.15


class LogLines(logging.Handler):
    """Keeps formatted log lines until the dashboard drains them, and the last errors, for
    the terminal once the dashboard has closed (`errors`)."""

    def __init__(self, capacity: int = 2000, kept_errors: int = 20) -> None:
        super().__init__()
        self.setFormatter(ConsoleFormatter())
        self.pending: deque[str] = deque(maxlen=capacity)
        self.errors: deque[str] = deque(maxlen=kept_errors)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            line = f"{record.levelname} {record.name}: {record.msg!r}"
        self.pending.append(line)
        if record.levelno >= logging.ERROR:
            self.errors.append(line)

    def drain(self) -> list[str]:
        out = list(self.pending)
        self.pending.clear()
        return out


def client_tab_text(view: ClientView) -> str:
    loss = "-" if view.last_loss is None else f"{view.last_loss:.3f}"
    return (
        f"State: {view.status}    Epoch: {view.epoch}    Step: {view.step}    "
        f"Role: {view.role}\n"
        f"Loss: {loss}    Global Speed: {format_count(view.tokens_per_sec, ' tok/s')}    "
        f"Efficiency: {view.efficiency * 100:.0f}%\n"
        f"Batch Size: {format_count(view.global_batch_tokens)} tokens    "
        f"Total Tokens: {format_count(view.total_tokens)}\n"
        f"My batches: {', '.join(view.my_batches) or '-'} ({view.batches_left} left)    "
        f"Up/down this step: {format_bytes(view.bytes_up_step)} / "
        f"{format_bytes(view.bytes_down_step)}\n"
        f"Weights hash: {view.weights_hash or '-'} ({view.sync_status})\n"
        f"Last checkpoint: {view.last_checkpoint or '-'}"
        + (f"\nCheckpoint error: {view.checkpoint_error}" if view.checkpoint_error else "")
        + (f"\nLink: {view.link_status}" if view.link_status.startswith("TOO SLOW") else "")
        + "".join(f"\nEval {line}" for line in view.evals)
    )


def coordinator_tab_text(view: ClientView) -> str:
    return (
        f"Run state: {view.run_state}\n"
        f"Clients: {len(view.clients)}    Height: {view.height}\n"
        f"Clients this round: {' '.join(view.clients) or '-'}\n"
        f"Data Source: {view.data_source or '-'}\n"
        f"Model Checkpoint: {view.checkpoint or '-'}"
    )


def _link_text(link: str) -> str:
    """ ", direct, we dialed", ", relayed, they dialed" or ", no connection"."""
    if not link or link == "none":
        return ", no connection"
    if link.endswith(RELAYED):
        return f", relayed, {link.removesuffix(RELAYED)}"
    return f", direct, {link}"


def network_tab_text(view: ClientView) -> str:
    lines = [
        f"Node ID: {view.client_id}",
        f"P2P: {view.reachability}",
        f"Link speed: {view.link_status or 'not measured yet'}",
        f"Recently Seen Peers ({len(view.peers)}):",
    ]
    for peer in view.peers:
        latency = "?" if peer.latency is None else f"{peer.latency:.3f}s"
        reach = "reachable" if peer.reachable else "outbound only"
        link = _link_text(peer.link)
        lines.append(
            f"  {peer.short_id} ({peer.address}) {reach}{link}: down "
            f"{format_bytes(peer.bytes_received)}, up {format_bytes(peer.bytes_sent)} ({latency})"
        )
    lines.append(f"Downloads ({len(view.downloads)}):")
    for row in view.downloads:
        pct = 100.0 * row.done / row.total if row.total else 0.0
        lines.append(f"  [{pct:5.1f}%] {row.done}/{row.total}: {row.label}")
    lines.append(f"Corrupted blobs rejected: {view.corrupt_blobs}")
    return "\n".join(lines)


class ShownClient(Protocol):
    """What the dashboard needs of the client: run it, and snapshot it (`ClientApp`)."""

    async def run(self) -> int: ...

    def snapshot(self) -> ClientSnapshot: ...


class ClientDashboard(App[int]):
    TITLE = "psyche-client"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "tab('client')", "Client"),
        Binding("2", "tab('coordinator')", "Coordinator"),
        Binding("3", "tab('network')", "Network"),
        Binding("4", "tab('logs')", "Logs"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self, client: ShownClient | None = None, log_lines: LogLines | None = None
    ) -> None:
        super().__init__()
        self.client = client
        self.log_lines = log_lines
        self.bandwidth = BandwidthMeter()
        self.exit_code = 0
        self.view = ClientView()

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="client"):
            with TabPane("Client", id="client"), Vertical():
                yield PlotextPlot(id="loss-plot")
                yield Static(id="client-stats", markup=False)
            with TabPane("Coordinator", id="coordinator"):
                yield Static(id="coordinator-text", markup=False)
            with TabPane("Network", id="network"), Horizontal():
                yield Static(id="network-text", markup=False)
                yield PlotextPlot(id="bandwidth-plot")
            with TabPane("Logs", id="logs"):
                yield RichLog(id="log", max_lines=2000, wrap=True)
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(REFRESH_SECONDS, self.refresh_view)
        if self.client is not None:
            self.run_worker(self._run_client(), exclusive=True, name="client")
        self.render_view(self.view)

    async def _run_client(self) -> None:
        from psyche_client.app.signals import run_until_signalled

        assert self.client is not None
        self.exit_code = await run_until_signalled(self.client.run())
        self.exit(self.exit_code)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def refresh_view(self) -> None:
        if self.client is not None:
            view = build_view(self.client.snapshot(), self.bandwidth)
            if view != self.view:  # redrawing the plots costs event-loop time the client shares
                self.view = view
                self.render_view(view)
        if self.log_lines is not None:
            log = self.query_one("#log", RichLog)
            for line in self.log_lines.drain():
                log.write(line)

    def render_view(self, view: ClientView) -> None:
        self.sub_title = f"{view.client_id}  {view.status}"
        self.query_one("#client-stats", Static).update(client_tab_text(view))
        self.query_one("#coordinator-text", Static).update(coordinator_tab_text(view))
        self.query_one("#network-text", Static).update(network_tab_text(view))
        loss_plot = self.query_one("#loss-plot", PlotextPlot)
        plt = loss_plot.plt
        plt.clear_data()
        plt.title("Loss")
        if view.losses:
            steps = [s for s, _ in view.losses]
            values = [v for _, v in view.losses]
            plt.plot(steps, values, marker="braille")
            low = max(0.0, min(values) - 0.1)
            plt.ylim(low, max(values) + 0.1)
        loss_plot.refresh()
        bw_plot = self.query_one("#bandwidth-plot", PlotextPlot)
        bw = bw_plot.plt
        bw.clear_data()
        total = view.bandwidth[-1] if view.bandwidth else 0.0
        bw.title(f"Download Bandwidth {format_bytes(total)}/s")
        if view.bandwidth:
            bw.plot(list(range(len(view.bandwidth))), list(view.bandwidth), marker="braille")
            bw.ylim(0, max(1024.0, max(view.bandwidth)))
        bw_plot.refresh()


def run_dashboard(options: ClientOptions, parts: Parts | None = None) -> int:
    """Run the client under the dashboard; its logs go to the Logs tab."""
    from psyche_client.app.app import ClientApp

    root = logging.getLogger()
    root.setLevel(logging.INFO)
    lines = LogLines()
    root.addHandler(lines)
    dashboard = ClientDashboard(ClientApp(options, parts), lines)
    result = dashboard.run()
    code = int(result if result is not None else dashboard.exit_code)
    if code != 0:  # the reason was on the dashboard, which is gone: say it on the terminal
        for line in lines.errors:
            print(line, file=sys.stderr)
    return code
