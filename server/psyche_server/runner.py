"""Building and running a `ServerApp` from files: the body of `psyche-server run`.

Loads and validates state.toml (and data.toml when the run hosts its data), builds the
coordinator, the optional TCP data server and the optional dashboard, prints the listening
line, and runs until SIGINT/SIGTERM (or `q` in the dashboard) on uvloop when available;
SIGHUP re-reads `--authorized-keys`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from psyche_common.config import ConfigError, load_data_config, load_state, validate_state
from psyche_common.config.data_location import ServerData
from psyche_common.coordinator import Coordinator
from psyche_common.protocol.authorization import AuthorizationError

from .app import ServerApp
from .data_server import DataServer, parse_socket_address
from .metrics_export import OtlpExporter, PrometheusExporter
from .options import ServerOptions

log = logging.getLogger("psyche.server")


class StartupError(Exception):
    """The server cannot start with the given files/options (the message says why)."""


@dataclass
class RunRequest:
    """Everything `psyche-server run` was asked to start."""

    state_path: Path
    options: ServerOptions
    data_config_path: Path | None = None
    tui: bool = False


def build_coordinator(state_path: Path, data_config_path: Path | None = None) -> Coordinator:
    """Load and validate the run (with its data.toml when given, so the checks that need it
    run and the 'needs --data-config' warning is not raised when one was passed)."""
    try:
        state = load_state(state_path)
        data_config = load_data_config(data_config_path) if data_config_path else None
    except (ConfigError, OSError) as exc:
        raise StartupError(f"Error found in config: {exc}") from None
    report = validate_state(state, data_config)
    if not report.ok:
        raise StartupError(f"Error found in config: {ConfigError(report.errors, state_path)}")
    for warning in report.warnings:
        log.warning("config: %s", warning)
    return Coordinator.from_state_file(state)


def build_data_server(
    coordinator: Coordinator, data_config_path: Path | None, options: ServerOptions
) -> DataServer | None:
    location = coordinator.model.data_location
    if not isinstance(location, ServerData):
        return None
    if data_config_path is None:
        raise StartupError(
            "Coordinator state requires we host training data, but no --data-config passed."
        )
    from psyche_common.data.local import LocalDataProvider

    try:
        data_config = load_data_config(data_config_path)
        provider = LocalDataProvider(
            data_config.dir,
            data_config.token_size,
            int(data_config.seq_len),
            data_config.shuffle_seed_bytes,
        )
        _, port = parse_socket_address(location.address)
    except (ConfigError, ValueError, OSError) as exc:
        raise StartupError(f"cannot start the data server: {exc}") from None
    return DataServer(
        provider,
        options.data_host,
        port,
        options.limits,
        run_id=coordinator.run_id,
        identity=options.identity,
    )


def build_app(request: RunRequest) -> ServerApp:
    coordinator = build_coordinator(request.state_path, request.data_config_path)
    data_server = build_data_server(coordinator, request.data_config_path, request.options)
    try:
        return ServerApp(coordinator, request.options, data_server=data_server)
    except (AuthorizationError, OSError, UnicodeDecodeError) as exc:
        raise StartupError(f"cannot read --authorized-keys: {exc}") from None


async def run_app(app: ServerApp, tui: bool) -> None:
    """Start `app`, announce the port, and serve until a signal (or the dashboard) stops it."""
    stop = asyncio.Event()
    log_buffer = None
    if tui:
        from .tui.log_buffer import LogBuffer

        log_buffer = LogBuffer()  # collects from the start, shown in the Logs tab
        logging.getLogger().addHandler(log_buffer)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Not available on Windows event loops (NotImplementedError) or off the main thread
        # (RuntimeError, e.g. an embedding test runner); Ctrl-C then ends the run as usual.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    if app.admission is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, app.reload_authorized_keys)
    try:
        port = await app.start()
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {app.options.host}:{app.options.port}: {exc}"
        ) from None
    print(f"psyche-server listening on {app.options.host}:{port}", flush=True)
    print(f"psyche-server key {app.options.identity.public_key.hex()}", flush=True)
    log.info(
        "server key %s (clients check it with --server-key)",
        app.options.identity.public_key.hex(),
        extra={"server_key": app.options.identity.public_key.hex()},
    )
    if app.relay is not None:
        print(f"psyche-server relay on {app.options.host}:{app.relay.port}", flush=True)
    if app.data_server is not None:
        print(
            f"psyche-server data server on {app.data_server.host}:{app.data_server.port}",
            flush=True,
        )
    exporters = start_exporters(app)
    dashboard_task: asyncio.Task[None] | None = None
    if tui:
        from .tui.app import ServerDashboard

        dashboard = ServerDashboard(app, log_buffer=log_buffer)

        async def run_dashboard() -> None:
            try:
                await dashboard.run_async()
            finally:
                stop.set()

        dashboard_task = asyncio.create_task(run_dashboard())
    try:
        await app.serve(stop)
    finally:
        if dashboard_task is not None:
            dashboard.exit()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(dashboard_task, 5)
        if log_buffer is not None:
            logging.getLogger().removeHandler(log_buffer)
        for exporter in exporters:
            await asyncio.to_thread(exporter.close)  # a last OTLP export may take a while
        log.info("server stopped")


def start_exporters(app: ServerApp) -> list[PrometheusExporter | OtlpExporter]:
    """The `--metrics-port` and `--otlp-metrics-url` exporters asked for, started (their own
    threads read `app.metrics_board`); prints where the Prometheus endpoint listens."""
    options = app.options
    exporters: list[PrometheusExporter | OtlpExporter] = []
    if options.metrics_port is not None:
        prometheus = PrometheusExporter(
            app.metrics_board, options.metrics_host, options.metrics_port
        )
        try:
            port = prometheus.start()
        except OSError as exc:
            raise StartupError(
                f"cannot serve metrics on {options.metrics_host}:{options.metrics_port}: {exc}"
            ) from None
        exporters.append(prometheus)
        print(f"psyche-server metrics on http://{options.metrics_host}:{port}/metrics", flush=True)
    if options.otlp_metrics_url is not None:
        exporters.append(
            OtlpExporter(app.metrics_board, options.otlp_metrics_url, options.otlp_interval)
        )
        log.info("exporting metrics over OTLP to %s", options.otlp_metrics_url)
    return exporters


def run_blocking(request: RunRequest) -> int:
    """Build and run; returns the process exit status."""
    try:
        app = build_app(request)
    except StartupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(run_app(app, request.tui))
        except StartupError as exc:
            print(str(exc), file=sys.stderr)
            return 1
    return 0
