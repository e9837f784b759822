"""`psyche-server run`: the click command (registered on the `psyche_server.cli:main` group)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import cast

import click
from psyche_common.bool_flag import bool_flag
from psyche_common.logs import LOG_LEVELS, LogFormat, setup_logging
from psyche_common.protocol import Identity

from .limits import ConnectionLimits
from .options import ServerOptions
from .relay_quota import RelayLimits
from .runner import RunRequest, run_blocking

_existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)


def _parse_keys(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> frozenset[bytes]:
    """Client public keys given as 64 hex characters (`psyche-client show-identity`)."""
    keys = set()
    for value in values:
        try:
            key = bytes.fromhex(value)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise click.BadParameter(
                f"{value!r} is not a client public key (64 hex characters, as "
                "`psyche-client show-identity` prints it)",
                param=param,
            )
        keys.add(key)
    return frozenset(keys)


def load_server_identity(path: Path | None) -> Identity:
    """The server's identity: from `path` (made there first when it does not exist), else a
    new one for this process."""
    if path is None:
        return Identity.generate()
    if not path.exists():
        identity = Identity.generate()
        try:
            identity.save(path)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write a new key to {path}: {exc}", param_hint="--identity-secret-key-path"
            ) from exc
        return identity
    try:
        return Identity.load(path)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--identity-secret-key-path") from exc


@click.command("run")
@click.option(
    "--state",
    "state_path",
    type=_existing_file,
    required=True,
    help="the run's state.toml (or a state file written by --save-state-dir, to resume)",
)
@click.option(
    "-s",
    "--server-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="coordinator port (default: a random free port, printed on start)",
)
@click.option("--host", default="0.0.0.0", show_default=True, help="address to bind")
@bool_flag(
    "--tui",
    default=None,
    help="the dashboard, or log lines (--tui false, --no-tui); default: on when stdout is a "
    "terminal",
)
@click.option(
    "--data-config",
    type=_existing_file,
    default=None,
    help="data.toml (needed when data_location is Server)",
)
@click.option(
    "--save-state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="keep DIR/{run_id}-latest.toml where a restart resumes (written at start-up, at every "
    "round and run-state change, and on SIGTERM/SIGINT) and write DIR/{run_id}-step{N}.toml at "
    "every successful epoch end (resume with `run --state FILE`)",
)
@click.option(
    "--init-warmup-time",
    type=click.IntRange(0),
    default=None,
    help="warmup time (s) until the run first becomes active",
)
@bool_flag(
    "--withdraw-on-disconnect",
    default=True,
    show_default=True,
    help="withdraw a client from the epoch when its connection drops (off: it stays a member "
    "until the coordinator's health checks remove it)",
)
@click.option(
    "--tick-interval",
    type=click.FloatRange(0.01),
    default=0.5,
    show_default=True,
    help="seconds between ticks",
)
@click.option(
    "--max-frame-size",
    type=click.IntRange(1024),
    default=8 * 1024 * 1024,
    show_default=True,
    help="largest accepted frame (bytes)",
)
@click.option(
    "--handshake-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="seconds a new connection has to authenticate",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=4096,
    show_default=True,
    help="open connections beyond which new ones are dropped",
)
@click.option(
    "--max-connections-per-ip",
    type=click.IntRange(1),
    default=32,
    show_default=True,
    help="open connections from one IP address beyond which its new ones are dropped",
)
@click.option(
    "--max-handshakes-per-ip",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="connections from one IP address still in their handshake beyond which its new ones "
    "are dropped",
)
@click.option(
    "--pre-join-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="seconds an authenticated connection has to send a valid Join before it is closed",
)
@click.option(
    "--max-send-buffer",
    type=click.IntRange(64 * 1024),
    default=8 * 1024 * 1024,
    show_default=True,
    help="bytes queued for one connection beyond which it is dropped as not reading (states "
    "are skipped for a connection with a quarter of this queued)",
)
@click.option(
    "--max-messages-per-second",
    type=click.FloatRange(0.1),
    default=100.0,
    show_default=True,
    help="messages per second one key may send; beyond it (and its burst) its messages are "
    "dropped, and a key that goes on for another burst's worth is disconnected",
)
@click.option(
    "--message-burst",
    type=click.IntRange(1),
    default=500,
    show_default=True,
    help="messages one key may send at once above its rate",
)
@click.option(
    "--max-message-ticks-per-second",
    type=click.FloatRange(0.1),
    default=20.0,
    show_default=True,
    help="coordinator ticks run after client messages, at most this many per second however "
    "many keys send (besides the --tick-interval grid)",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0),
    default=300.0,
    show_default=True,
    help="seconds a joined connection may send nothing before it is closed (0: never; "
    "clients send a keepalive after 30 s of silence)",
)
@click.option(
    "--checkpointer",
    "checkpointers",
    multiple=True,
    callback=_parse_keys,
    metavar="KEY",
    help="a client public key (hex) whose Checkpoint messages may set the run's checkpoint; "
    "repeat for several (default: none, every Checkpoint message is refused)",
)
@click.option(
    "--authorized-keys",
    type=_existing_file,
    default=None,
    help="a permissioned run: only the ed25519 public keys listed in this file (64 hex "
    "characters per line, # comments) and the delegates they authorize "
    "(`psyche-client authorize`) may join; re-read when it changes or on SIGHUP "
    "(default: anyone may join)",
)
@click.option(
    "--identity-secret-key-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the server's ed25519 secret key (32 raw bytes or 64 hex characters); made and "
    "saved there (mode 0600) when the file does not exist yet, so the key outlives restarts. "
    "Its public key, printed at start, is what clients check with `train --server-key` "
    "(default: a new key at every start)",
)
@bool_flag(
    "--relay",
    default=True,
    show_default=True,
    help="relay P2P traffic between clients that cannot connect to each other (e.g. both "
    "behind NAT): pipes through this server, end-to-end authenticated by the clients",
)
@click.option(
    "--relay-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="a port of the relay's own (default: the relay shares the coordinator port, told "
    "apart by the handshake; 0: a random free port; clients learn it from the server)",
)
@click.option(
    "--relay-max-mbps",
    type=click.FloatRange(0),
    default=100.0,
    show_default=True,
    help="most the relay forwards, in Mbit/s over all pipes and both directions (0: no cap)",
)
@click.option(
    "--relay-max-pipes-per-ip",
    type=click.IntRange(1),
    default=RelayLimits.max_pipes_per_ip,
    show_default=True,
    help="relay pipes (open or waiting for their second end) dialed from one IP address, "
    "whatever the keys (one address also holds at most "
    f"{RelayLimits.max_pipes_per_ip_to_client} pipes to any one client)",
)
@click.option(
    "--relay-max-connections-per-ip",
    type=click.IntRange(1),
    default=RelayLimits.max_connections_per_ip,
    show_default=True,
    help="relay connections (listen channels, pipe ends, requests) from one IP address",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="serve the run's metrics (loss, tokens/s, step, members, convictions, ...) at "
    "http://HOST:PORT/metrics in the Prometheus text format (0: a free port, printed on "
    "start; default: off)",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="address the --metrics-port endpoint binds",
)
@click.option(
    "--otlp-metrics-url",
    "--oltp-metrics-url",  # the reference's spelling
    "otlp_metrics_url",
    default=None,
    metavar="URL",
    help="push the same metrics over OpenTelemetry's OTLP/HTTP to URL (e.g. "
    "http://collector:4318/v1/metrics; default: off)",
)
@click.option(
    "--otlp-metrics-interval",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="seconds between two OTLP exports",
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default="console",
    show_default=True,
    help="console: human-readable lines; json: one JSON object per line (ts, level, logger, msg "
    "and structured fields)",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="lowest level logged",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="append logs to this file instead of stderr (with the dashboard: as well as its Logs tab)",
)
def run(
    state_path: Path,
    server_port: int,
    host: str,
    tui: bool | None,
    data_config: Path | None,
    save_state_dir: Path | None,
    init_warmup_time: int | None,
    withdraw_on_disconnect: bool,
    tick_interval: float,
    max_frame_size: int,
    handshake_timeout: float,
    max_connections: int,
    max_connections_per_ip: int,
    max_handshakes_per_ip: int,
    pre_join_timeout: float,
    max_send_buffer: int,
    max_messages_per_second: float,
    message_burst: int,
    max_message_ticks_per_second: float,
    idle_timeout: float,
    checkpointers: frozenset[bytes],
    authorized_keys: Path | None,
    identity_secret_key_path: Path | None,
    relay: bool,
    relay_port: int | None,
    relay_max_mbps: float,
    relay_max_pipes_per_ip: int,
    relay_max_connections_per_ip: int,
    metrics_port: int | None,
    metrics_host: str,
    otlp_metrics_url: str | None,
    otlp_metrics_interval: float,
    log_format: str,
    log_level: str,
    log_file: Path | None,
) -> None:
    """Run the coordinator server for the run described by --state."""
    use_tui = sys.stdout.isatty() if tui is None else tui
    if use_tui and log_file is None:
        # The dashboard owns the terminal: logs go only to its Logs tab.
        logging.getLogger().setLevel(log_level.upper())
    else:
        setup_logging(cast(LogFormat, log_format), log_level, file=log_file)
    options = ServerOptions(
        identity=load_server_identity(identity_secret_key_path),
        host=host,
        port=server_port,
        save_state_dir=save_state_dir,
        init_warmup_time=init_warmup_time,
        withdraw_on_disconnect=withdraw_on_disconnect,
        tick_interval=tick_interval,
        limits=ConnectionLimits(
            max_frame_size=max_frame_size,
            handshake_timeout=handshake_timeout,
            max_connections=max_connections,
            max_connections_per_ip=max_connections_per_ip,
            max_handshakes_per_ip=max_handshakes_per_ip,
            pre_join_timeout=pre_join_timeout,
            max_buffered_send_bytes=max_send_buffer,
            messages_per_second=max_messages_per_second,
            message_burst=message_burst,
            max_message_ticks_per_second=max_message_ticks_per_second,
            idle_timeout=idle_timeout or None,
        ),
        checkpointers=checkpointers,
        relay=RelayLimits(
            max_mbps=relay_max_mbps or None,
            max_pipes_per_ip=relay_max_pipes_per_ip,
            max_connections_per_ip=relay_max_connections_per_ip,
        )
        if relay
        else None,
        relay_port=relay_port,
        authorized_keys=authorized_keys,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        otlp_metrics_url=otlp_metrics_url,
        otlp_interval=otlp_metrics_interval,
    )
    request = RunRequest(state_path, options, data_config, tui=use_tui)
    raise SystemExit(run_blocking(request))
