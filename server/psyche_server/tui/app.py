"""`ServerDashboard`: the Textual dashboard of a running `ServerApp`.

Tabs: [1] Dashboard (with the loss and throughput charts), [2] Coordinator, [3] Data server,
[4] Logs. Digit keys switch tabs, `q` quits (which stops the server), Ctrl+P pauses (deferred to
cooldown while the run is active) or resumes. The view is refreshed every 150 ms from `view_model.build_view`.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, ProgressBar, RichLog, Static, TabbedContent, TabPane
from textual_plotext import PlotextPlot

from ..app import ServerApp
from .log_buffer import LogBuffer
from .view_model import ChartsView, DashboardView, build_view

TABS = ("dashboard", "coordinator", "data", "logs")


class Box(Static):
    """A bordered text box with a title."""

    DEFAULT_CSS = """
    Box { border: round $accent; padding: 0 1; height: auto; }
    """

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.border_title = title


class ServerDashboard(App[None]):
    """The `psyche-server run` dashboard (Dashboard, Coordinator, Data server and Logs tabs;
    Ctrl+P pauses or resumes the run)."""

    TITLE = "psyche-server"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #top { height: auto; }
    #top > Box { width: 1fr; }
    .column { width: 1fr; }
    #data-gauge { margin: 1 1; }
    #charts { height: 14; }
    #charts > PlotextPlot { width: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+p", "toggle_pause", "Pause/resume", priority=True),
        *(
            Binding(str(i + 1), f"show_tab('{tab}')", tab.title(), show=False)
            for i, tab in enumerate(TABS)
        ),
    ]

    def __init__(
        self,
        server: ServerApp,
        log_buffer: LogBuffer | None = None,
        refresh_interval: float = 0.15,
    ) -> None:
        super().__init__()
        self.server = server
        self.refresh_interval = refresh_interval
        self.log_buffer = log_buffer or LogBuffer()
        self._owns_handler = log_buffer is None
        self.last_view: DashboardView | None = None
        self._drawn_charts: ChartsView | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="dashboard"):
            with TabPane("[1] Dashboard", id="dashboard"):
                with Horizontal(id="top"):
                    yield Box("Server Address", id="address")
                    yield Box("Run ID", id="run-id")
                    yield Box("", id="pause-hint")
                with Horizontal():
                    with Vertical(classes="column"):
                        yield Box("Run state", id="run-state")
                        yield Box("Clients next round", id="next-round")
                    with Vertical(classes="column"):
                        yield Box("Coordinator info", id="coordinator-info")
                        yield Box("Clients this round", id="this-round")
                        yield Box("Exited this epoch", id="exited")
                        yield Box("Evals (median of witnesses)", id="evals")
                with Horizontal(id="charts"):
                    yield PlotextPlot(id="loss-plot")
                    yield PlotextPlot(id="throughput-plot")
            with TabPane("[2] Coordinator", id="coordinator"), Horizontal():
                with Vertical(classes="column"):
                    yield Box("Run state", id="coord-run-state")
                    yield Box("Clients this round", id="coord-clients")
                with Vertical(classes="column"):
                    yield Box("Config", id="coord-config")
                    yield Box("Rounds", id="coord-rounds")
            with TabPane("[3] Data server", id="data"):
                yield Box("Stats", id="data-stats")
                yield ProgressBar(total=100, show_eta=False, id="data-gauge")
                with Horizontal():
                    yield Box("Clients", id="data-clients")
                    yield Box("Current state", id="data-state")
            with TabPane("[4] Logs", id="logs"):
                yield RichLog(id="log", max_lines=2000, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        if self._owns_handler:
            logging.getLogger().addHandler(self.log_buffer)
        log_widget = self.query_one("#log", RichLog)
        for line in list(self.log_buffer.lines):
            log_widget.write(line)
        self.log_buffer.new_lines()
        self.refresh_view()
        self.set_interval(self.refresh_interval, self.refresh_view)

    def on_unmount(self) -> None:
        if self._owns_handler:
            logging.getLogger().removeHandler(self.log_buffer)

    def _set(self, widget_id: str, text: str) -> None:
        self.query_one(f"#{widget_id}", Static).update(text)

    def refresh_view(self) -> None:
        view = build_view(self.server, int(time.time()))
        self.last_view = view
        self._set("address", view.address)
        self._set("run-id", view.run_id)
        self._set("pause-hint", view.pause_hint)
        self._set("run-state", view.run_state)
        self._set("next-round", "\n".join(view.next_round_clients) or "(none)")
        self._set(
            "coordinator-info",
            "\n".join(
                [
                    view.clients_line,
                    f"Height: {view.height}",
                    f"Epoch: {view.epoch}  Step: {view.step}",
                    f"Checkpoint: {view.checkpoint}",
                    view.weights_line,
                    view.verification_line,
                    view.relay_line,
                ]
            ),
        )
        self._set("this-round", "\n".join(view.clients_this_round) or "(none)")
        self._set("exited", "\n".join(view.exited_clients) or "(none)")
        self._set("evals", "\n".join(view.eval_lines) or "(no eval scores reported)")
        self._set("coord-run-state", view.run_state)
        self._set("coord-clients", "\n".join(view.clients_this_round) or "(none)")
        self._set("coord-config", "\n".join(view.config_lines))
        self._set("coord-rounds", "\n".join(view.round_lines))
        if view.data is None:
            self._set("data-stats", "no data :(  (this run does not host its data)")
            self._set("data-clients", "")
            self._set("data-state", "")
        else:
            data = view.data
            self._set(
                "data-stats",
                f"Total samples: {data.total_samples}\nProvided samples: {data.provided_samples}",
            )
            self.query_one("#data-gauge", ProgressBar).update(
                progress=100 * data.fraction_given_out
            )
            self._set("data-clients", "\n".join(data.per_client) or "(none)")
            self._set("data-state", f"Clients: {data.clients_served}\nHeight: {data.height}")
        if view.charts != self._drawn_charts:  # redrawing costs event-loop time the server shares
            self._drawn_charts = view.charts
            self._draw_chart("loss-plot", "Loss (median of witnesses)", view.charts.losses)
            self._draw_chart(
                "throughput-plot", "Tokens/s per client (median)", view.charts.tokens_per_sec
            )
        log_widget = self.query_one("#log", RichLog)
        for line in self.log_buffer.new_lines():
            log_widget.write(line)

    def _draw_chart(
        self, widget_id: str, title: str, points: tuple[tuple[int, float], ...]
    ) -> None:
        plot = self.query_one(f"#{widget_id}", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.title(title if points else f"{title}: no witness reports yet")
        if points:
            values = [v for _, v in points]
            plt.plot([s for s, _ in points], values, marker="braille")
            low, high = min(values), max(values)
            margin = max(0.05 * (high - low), 0.01 * abs(high), 1e-6)
            plt.ylim(low - margin, high + margin)
        plot.refresh()

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_toggle_pause(self) -> None:
        outcome = self.server.toggle_pause()
        self.notify(f"Run {outcome}", timeout=3)
        self.refresh_view()
