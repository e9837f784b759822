"""Every option of `psyche-server run`, written once (a `psyche_common.flag_table`): its flag,
click type, default and help, and the field of `ServerOptions` it sets (`target`: "port",
"limits.max_frame_size", "relay.max_mbps"; None for those `run` handles itself: the files,
the dashboard, logging, the identity file and `--relay`).

The defaults are the option types' own (`ServerOptions`, `ConnectionLimits`, `RelayLimits`),
read from them, so they are written in one place; `server_options` fills a `ServerOptions`
from the parsed values (tests/unit/server/test_run_flags.py checks the table against the
fields). Unlike the client's, these options are not read from the environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import click
from psyche_common.flag_table import Flag, PublicKeyType, default_of, with_flags
from psyche_common.logs import LOG_LEVELS
from psyche_common.protocol import Identity

from .events_options import EventsOptions
from .limits import ConnectionLimits
from .options import ServerOptions
from .relay_quota import RelayLimits

_EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


class HttpUrlType(click.ParamType):
    """An http:// or https:// URL with a host (and a valid port, when it has one)."""

    name = "URL"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 (raises ValueError on a port out of range or not a number)
        except ValueError as exc:
            self.fail(f"{text!r} is not a URL: {exc}", param, ctx)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.fail(
                f"{text!r} is not an http:// or https:// URL with a host (e.g. "
                "http://collector:4318/v1/metrics)",
                param,
                ctx,
            )
        return text


def _server(name: str) -> object:
    return default_of(ServerOptions, name)


def _limit(name: str) -> object:
    return default_of(ConnectionLimits, name)


def _relay(name: str) -> object:
    return default_of(RelayLimits, name)


def key_set(values: object) -> object:
    """The repeated `--checkpointer` keys (a tuple) as the field's frozenset."""
    return frozenset(cast(Iterable[bytes], values))


def zero_is_none(value: object) -> object:
    """0 (the flag's "no limit") to None (the field's)."""
    return value or None


RUN_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--state",
        "the run's state.toml (or a state file written by --save-state-dir, to resume)",
        type=_EXISTING_FILE,
        required=True,
        dest="state_path",
    ),
    Flag(
        "--server-port",
        "coordinator port (default: a random free port, printed on start)",
        "port",
        _server("port"),
        click.IntRange(0, 65535),
        short="-s",
    ),
    Flag("--host", "address to bind", "host", _server("host"), show_default=True),
    Flag(
        "--tui",
        "the dashboard, or log lines (--tui false, --no-tui); default: on when stdout is a "
        "terminal",
        is_flag=True,
    ),
    Flag(
        "--data-config",
        "data.toml (needed when data_location is Server)",
        type=_EXISTING_FILE,
    ),
    Flag(
        "--save-state-dir",
        "keep DIR/{run_id}-latest.toml where a restart resumes (written at start-up, at every "
        "round and run-state change, and on SIGTERM/SIGINT) and write DIR/{run_id}-step{N}.toml "
        "at every successful epoch end (resume with `run --state FILE`)",
        "save_state_dir",
        type=click.Path(file_okay=False, path_type=Path),
        metavar="DIR",
    ),
    Flag(
        "--init-warmup-time",
        "warmup time (s) until the run first becomes active",
        "init_warmup_time",
        type=click.IntRange(0),
    ),
    Flag(
        "--withdraw-on-disconnect",
        "withdraw a client from the epoch when its connection drops (off: it stays a member "
        "until the coordinator's health checks remove it)",
        "withdraw_on_disconnect",
        _server("withdraw_on_disconnect"),
        is_flag=True,
        show_default=True,
    ),
    Flag(
        "--tick-interval",
        "seconds between ticks",
        "tick_interval",
        _server("tick_interval"),
        click.FloatRange(0.01),
        show_default=True,
    ),
    Flag(
        "--max-frame-size",
        "largest accepted frame (bytes)",
        "limits.max_frame_size",
        _limit("max_frame_size"),
        click.IntRange(1024),
        show_default=True,
    ),
    Flag(
        "--handshake-timeout",
        "seconds a new connection has to authenticate",
        "limits.handshake_timeout",
        _limit("handshake_timeout"),
        click.FloatRange(0.1),
        show_default=True,
    ),
    Flag(
        "--max-connections",
        "open connections beyond which new ones are dropped",
        "limits.max_connections",
        _limit("max_connections"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--max-connections-per-ip",
        "open connections from one IP address (an IPv6 /64 counts as one) beyond which its new "
        "ones are dropped",
        "limits.max_connections_per_ip",
        _limit("max_connections_per_ip"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--max-handshakes-per-ip",
        "connections from one IP address (an IPv6 /64 counts as one) still in their handshake "
        "beyond which its new ones are dropped",
        "limits.max_handshakes_per_ip",
        _limit("max_handshakes_per_ip"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--pre-join-timeout",
        "seconds an authenticated connection has to send a valid Join before it is closed",
        "limits.pre_join_timeout",
        _limit("pre_join_timeout"),
        click.FloatRange(0.1),
        show_default=True,
    ),
    Flag(
        "--max-send-buffer",
        "bytes queued for one connection beyond which it is dropped as not reading (states "
        "are skipped for a connection with a quarter of this queued)",
        "limits.max_buffered_send_bytes",
        _limit("max_buffered_send_bytes"),
        click.IntRange(64 * 1024),
        show_default=True,
    ),
    Flag(
        "--max-messages-per-second",
        "messages per second one key may send; beyond it (and its burst) its messages are "
        "dropped, and a key that goes on for another burst's worth is disconnected",
        "limits.messages_per_second",
        _limit("messages_per_second"),
        click.FloatRange(0.1),
        show_default=True,
    ),
    Flag(
        "--message-burst",
        "messages one key may send at once above its rate",
        "limits.message_burst",
        _limit("message_burst"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--max-message-ticks-per-second",
        "coordinator ticks run after client messages, at most this many per second however "
        "many keys send (besides the --tick-interval grid)",
        "limits.max_message_ticks_per_second",
        _limit("max_message_ticks_per_second"),
        click.FloatRange(0.1),
        show_default=True,
    ),
    Flag(
        "--idle-timeout",
        "seconds a joined connection may send nothing before it is closed (0: never; "
        "clients send a keepalive after 30 s of silence)",
        "limits.idle_timeout",
        _limit("idle_timeout"),
        click.FloatRange(0),
        show_default=True,
        convert=zero_is_none,
    ),
    Flag(
        "--checkpointer",
        "a client public key (hex) whose Checkpoint messages may set the run's checkpoint; "
        "repeat for several (default: none, every Checkpoint message is refused)",
        "checkpointers",
        type=PublicKeyType("a client public key", "as `psyche-client show-identity` prints it"),
        multiple=True,
        metavar="KEY",
        dest="checkpointers",
        convert=key_set,
    ),
    Flag(
        "--authorized-keys",
        "a permissioned run: only the ed25519 public keys listed in this file (64 hex "
        "characters per line, # comments) and the delegates they authorize "
        "(`psyche-client authorize`) may join; re-read when it changes or on SIGHUP "
        "(default: anyone may join)",
        "authorized_keys",
        type=_EXISTING_FILE,
    ),
    Flag(
        "--max-delegates-per-authorizer",
        "in a permissioned run, the delegates of one listed key admitted at a time, counted "
        "across all its authorizations (pending and members); a further delegate is refused",
        "max_delegates_per_authorizer",
        _server("max_delegates_per_authorizer"),
        click.IntRange(0),
        show_default=True,
    ),
    Flag(
        "--max-authorization-days",
        "in a permissioned run, an authorization that expires more than this many days "
        "from now is refused",
        "max_authorization_days",
        _server("max_authorization_days"),
        click.FloatRange(0, min_open=True),
        show_default=True,
    ),
    Flag(
        "--identity-secret-key-path",
        "the server's ed25519 secret key (32 raw bytes or 64 hex characters); made and "
        "saved there (mode 0600) when the file does not exist yet, so the key outlives "
        "restarts. Its public key, printed at start, is what clients check with `train "
        "--server-key` (default: a new key at every start)",
        type=click.Path(dir_okay=False, path_type=Path),
    ),
    Flag(
        "--relay",
        "relay P2P traffic between clients that cannot connect to each other (e.g. both "
        "behind NAT): pipes through this server, end-to-end authenticated by the clients",
        default=True,
        is_flag=True,
        show_default=True,
    ),
    Flag(
        "--relay-port",
        "a port of the relay's own (default: the relay shares the coordinator port, told "
        "apart by the handshake; 0: a random free port; clients learn it from the server)",
        "relay_port",
        type=click.IntRange(0, 65535),
    ),
    Flag(
        "--relay-max-mbps",
        "most the relay forwards, in Mbit/s over all pipes and both directions (0: no cap)",
        "relay.max_mbps",
        _relay("max_mbps"),
        click.FloatRange(0),
        show_default=True,
        convert=zero_is_none,
    ),
    Flag(
        "--relay-max-pipes-per-ip",
        "relay pipes (open or waiting for their second end) dialed from one IP address (an IPv6 "
        "/64 counts as one), "
        "whatever the keys (one address also holds at most "
        f"{RelayLimits.max_pipes_per_ip_to_client} pipes to any one client)",
        "relay.max_pipes_per_ip",
        _relay("max_pipes_per_ip"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--relay-max-connections-per-ip",
        "relay connections (listen channels, pipe ends, requests) from one IP address (an IPv6 "
        "/64 counts as one)",
        "relay.max_connections_per_ip",
        _relay("max_connections_per_ip"),
        click.IntRange(1),
        show_default=True,
    ),
    Flag(
        "--metrics-port",
        "serve the run's metrics (loss, tokens/s, step, members, convictions, ...) at "
        "http://HOST:PORT/metrics in the Prometheus text format (0: a free port, printed on "
        "start; default: off)",
        "metrics_port",
        type=click.IntRange(0, 65535),
    ),
    Flag(
        "--metrics-host",
        "address the --metrics-port endpoint binds",
        "metrics_host",
        _server("metrics_host"),
        show_default=True,
    ),
    Flag(
        "--otlp-metrics-url",
        "push the same metrics over OpenTelemetry's OTLP/HTTP to URL (e.g. "
        "http://collector:4318/v1/metrics; default: off)",
        "otlp_metrics_url",
        type=HttpUrlType(),
        aliases=("--oltp-metrics-url",),  # the reference's spelling
        dest="otlp_metrics_url",
        metavar="URL",
    ),
    Flag(
        "--otlp-metrics-interval",
        "seconds between two OTLP exports",
        "otlp_interval",
        _server("otlp_interval"),
        click.FloatRange(0.1),
        show_default=True,
    ),
    Flag(
        "--log-format",
        "console: human-readable lines; json: one JSON object per line (ts, level, logger, msg "
        "and structured fields)",
        default="console",
        type=click.Choice(["console", "json"]),
        show_default=True,
    ),
    Flag(
        "--log-level",
        "lowest level logged",
        default="info",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        show_default=True,
    ),
    Flag(
        "--log-file",
        "append logs to this file instead of stderr (with the dashboard: as well as its Logs tab)",
        type=click.Path(dir_okay=False, path_type=Path),
    ),
    Flag(
        "--events-dir",
        "record every change of the coordinator (state, epoch, step, members) in "
        "DIR/coordinator/events-epoch-*.jsonl, clients' own events may go to the same DIR "
        "(`train --events-dir`); read them with `psyche-server observe --events-dir DIR`",
        "events.dir",
        type=click.Path(file_okay=False, path_type=Path),
    ),
    Flag(
        "--keep-event-files",
        "event files (one per epoch) kept in --events-dir; older ones are deleted",
        "events.keep_files",
        default_of(EventsOptions, "keep_files"),
        type=click.IntRange(1),
        show_default=True,
    ),
)


def server_options(values: Mapping[str, object], identity: Identity) -> ServerOptions:
    """The `ServerOptions` of `run`'s parsed values (by Python name; a missing one takes its
    default), with the identity `run` loaded."""
    limits = with_flags(ConnectionLimits(), RUN_FLAGS, "limits", values)
    relay = (
        with_flags(RelayLimits(), RUN_FLAGS, "relay", values) if values.get("relay", True) else None
    )
    events = with_flags(EventsOptions(), RUN_FLAGS, "events", values)
    base = ServerOptions(identity=identity, limits=limits, relay=relay, events=events)
    return with_flags(base, RUN_FLAGS, "", values)


VALIDATE_FLAGS: tuple[Flag, ...] = (
    Flag("--state", "state.toml", type=_EXISTING_FILE, required=True, dest="state_path"),
    Flag(
        "--data-config",
        "data.toml of the TCP data server (checked against the state file)",
        type=_EXISTING_FILE,
        dest="data_config_path",
    ),
    Flag("--run-id", "run id to use instead of the file's (needed for files without run_id)"),
)
"""`psyche-server validate-config`'s options."""
