"""`psyche-server run`'s options and `ServerOptions` come from one table (`flags.RUN_FLAGS`):
every flag that sets a field names one that exists, with the field's default; every field has
a flag or is named here; the click command declares exactly the table's flags; and a parsed
command line fills the options as the flags say."""

from __future__ import annotations

from pathlib import Path

import click
from psyche_common.flag_table import Flag
from psyche_common.protocol import Identity
from psyche_server.cli import main
from psyche_server.flags import RUN_FLAGS, VALIDATE_FLAGS, server_options
from psyche_server.options import ServerOptions

from tests.support.flag_tables import declaration_mismatches, fields_without_flag, target_mismatches

EXAMPLE_STATE = Path(__file__).resolve().parents[3] / "state.toml.example"
SECTIONS = ("", "limits", "relay")
NOT_FLAGS = {
    "identity",  # --identity-secret-key-path, loaded by `run`
    "data_host",  # the data server binds all interfaces
    "limits.max_skipped_states",
    "limits.socket_send_buffer",
    "relay.max_pipes",
    "relay.max_pipes_per_client",
    "relay.max_pipes_per_pair",
    "relay.max_pipes_per_ip_to_client",
    "relay.max_connections",
    "relay.handshake_timeout",
    "relay.accept_timeout",
    "relay.listen_idle_timeout",
    "relay.pipe_idle_timeout",
}
"""Fields no flag sets (tests, benchmarks and embedders set them)."""


def defaults() -> ServerOptions:
    return ServerOptions(identity=Identity.generate())


def parsed(*args: str) -> dict[str, object]:
    """`run`'s values for a command line (after `--state`), as click parses them."""
    command = main.commands["run"]
    with command.make_context("run", ["--state", str(EXAMPLE_STATE), *args]) as ctx:
        return dict(ctx.params)


def test_every_flag_target_is_a_field_with_its_default() -> None:
    assert target_mismatches(RUN_FLAGS, defaults()) == []


def test_every_field_has_a_flag_or_a_reason() -> None:
    assert fields_without_flag(RUN_FLAGS, defaults(), SECTIONS, NOT_FLAGS) == []


def test_the_commands_declare_exactly_the_tables_flags() -> None:
    assert declaration_mismatches(main.commands["run"], RUN_FLAGS, from_environment=False) == []
    validate = main.commands["validate-config"]
    assert declaration_mismatches(validate, VALIDATE_FLAGS, from_environment=False) == []


def test_the_checks_catch_a_table_that_drifted() -> None:
    drifted = (
        Flag("--tick-interval", "h", "tick_interval", 0.25),
        Flag("--max-frame-size", "h", "limits.max_frame_bytes", 1024),
    )
    assert target_mismatches(drifted, defaults()) == [
        "--tick-interval: default 0.25, tick_interval 0.5",
        "--max-frame-size: no field limits.max_frame_bytes",
    ]
    assert "host" in fields_without_flag(drifted, defaults(), ("",), set())
    assert declaration_mismatches(main.commands["run"], drifted, from_environment=False) != []


def test_no_flags_give_the_default_options() -> None:
    identity = Identity.generate()
    options = server_options(parsed(), identity)
    assert options == ServerOptions(identity=identity)


def test_a_command_line_fills_every_section() -> None:
    key = "ab" * 32
    options = server_options(
        parsed(
            *("-s", "4000", "--host", "127.0.0.1", "--idle-timeout", "0"),
            *("--max-send-buffer", "65536", "--checkpointer", key, "--relay-max-mbps", "0"),
            *("--relay-max-pipes-per-ip", "7", "--otlp-metrics-url", "http://c:4318/v1/metrics"),
            *("--no-withdraw-on-disconnect", "--metrics-port", "0"),
        ),
        Identity.generate(),
    )
    assert (options.port, options.host, options.withdraw_on_disconnect) == (
        4000,
        "127.0.0.1",
        False,
    )
    assert options.limits.idle_timeout is None  # 0: never
    assert options.limits.max_buffered_send_bytes == 65536
    assert options.checkpointers == frozenset({bytes.fromhex(key)})
    assert options.relay is not None and options.relay.max_mbps is None  # 0: no cap
    assert options.relay.max_pipes_per_ip == 7
    assert options.otlp_metrics_url == "http://c:4318/v1/metrics" and options.metrics_port == 0
    assert server_options(parsed("--relay", "false"), Identity.generate()).relay is None


def test_the_reference_spelling_of_the_otlp_flag_is_accepted() -> None:
    values = parsed("--oltp-metrics-url", "https://collector/v1/metrics")
    assert values["otlp_metrics_url"] == "https://collector/v1/metrics"


def test_an_otlp_url_must_be_http_with_a_host() -> None:
    for bad in ("notaurl", "ftp://c/x", "http://", "http://c:99999/x"):
        try:
            parsed("--otlp-metrics-url", bad)
        except click.BadParameter as exc:
            assert bad in exc.format_message()
        else:
            raise AssertionError(f"{bad} was accepted")
