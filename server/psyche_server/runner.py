"""Building and running a `ServerApp` from files: the body of `psyche-server run`.

Loads and validates state.toml (and data.toml when given) as `validate-config` does
(`run_files.load_run`), takes its coordinator, builds the optional TCP data server and the
optional dashboard, prints the listening line, and runs until SIGINT/SIGTERM (or `q` in the dashboard) on uvloop when available;
SIGHUP re-reads `--authorized-keys`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from psyche_common.config import ConfigError
from psyche_common.config.data_location import ServerData
from psyche_common.data.errors import DataError
from psyche_common.events.files import EventFileError
from psyche_common.protocol.authorization import AuthorizationError

from .app import ServerApp
from .data_server import DataServer, parse_socket_address
from .metrics_export import OtlpExporter, PrometheusExporter
from .options import ServerOptions
from .run_files import LoadedRun, load_run

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


def load_checked_run(state_path: Path, data_config_path: Path | None = None) -> LoadedRun:
    """The run's files through `run_files.load_run` (the checks `validate-config` makes, with
    data.toml when given): warnings logged, errors raised as `StartupError`."""
    try:
        loaded = load_run(state_path, data_config_path)
    except ConfigError as exc:
        raise StartupError(f"Error found in config: {exc}") from None
    for warning in loaded.report.warnings:
        log.warning("config: %s", warning)
    error = loaded.error()
    if error is not None:
        raise StartupError(f"Error found in config: {error}")
    return loaded


def build_data_server(loaded: LoadedRun, options: ServerOptions) -> DataServer | None:
    """The TCP data server of a run whose data location is this server (else None)."""
    location = loaded.state.model.data_location
    if not isinstance(location, ServerData):
        return None
    data_config = loaded.data_config
    if data_config is None:
        raise StartupError(
            "Coordinator state requires we host training data, but no --data-config passed."
        )
    from psyche_common.data.local import LocalDataProvider

    try:
        provider = LocalDataProvider(
            data_config.dir,
            data_config.token_size,
            int(data_config.seq_len),
            data_config.shuffle_seed_bytes,
        )
        _, port = parse_socket_address(location.address)
    except (ConfigError, DataError, ValueError, OSError) as exc:
        raise StartupError(f"cannot start the data server: {exc}") from None
    return DataServer(
        provider,
        options.data_host,
        port,
        options.limits,
        run_id=loaded.state.run_id,
        identity=options.identity,
    )


def check_save_state_dir(path: Path) -> None:
    """`--save-state-dir` must be a directory this process can write (made when missing):
    found at start, not at the first save."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".psyche-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StartupError(
            f"--save-state-dir {path}: cannot write there ({reason}); give a directory this "
            "user can create and write"
        ) from None


def build_app(request: RunRequest) -> ServerApp:
    loaded = load_checked_run(request.state_path, request.data_config_path)
    assert loaded.coordinator is not None  # a run without errors has one
    if request.options.save_state_dir is not None:
        check_save_state_dir(request.options.save_state_dir)
    data_server = build_data_server(loaded, request.options)
    try:
        app = ServerApp(loaded.coordinator, request.options, data_server=data_server)
    except EventFileError as exc:
        raise StartupError(f"--events-dir: {exc}") from None
    except (AuthorizationError, OSError, UnicodeDecodeError) as exc:
        raise StartupError(f"cannot read --authorized-keys: {exc}") from None
    if app.admission is not None and not app.admission.keys.keys:
        raise StartupError(
            f"--authorized-keys {request.options.authorized_keys} lists no key, so nobody "
            "could join this run: add the clients' public keys (64 hex characters per line, "
            "as `psyche-client show-identity` prints them), or leave the flag out for an "
            "open run"
        )
    return app


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
        raise StartupError(start_failure(app, exc)) from None
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


def start_failure(app: ServerApp, exc: OSError) -> str:
    """Why `app.start` failed, naming the port that could not be bound (it starts the data
    server, then the coordinator port, then the relay's own port)."""
    data_server = app.data_server
    if data_server is not None and data_server.port is None:
        return (
            f"cannot start the data server on {data_server.host}:{data_server.requested_port} "
            f"(model.LLM.data_location): {exc}"
        )
    if app.port is None:
        return f"cannot listen on {app.options.host}:{app.options.port}: {exc}"
    return str(exc)  # the relay's own port, named with the flags to change


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
