"""`psyche-server run`: the click command (registered on the `psyche_server.cli:main` group).

Its options are the table `flags.RUN_FLAGS`; `flags.server_options` turns the parsed values
into `ServerOptions`, and this module handles the few the options do not hold: the files
(`--state`, `--data-config`), the dashboard, logging and the identity file.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import cast

import click
from psyche_common.flag_table import options
from psyche_common.logs import LogFormat, setup_logging
from psyche_common.protocol import Identity

from .flags import RUN_FLAGS, server_options
from .runner import RunRequest, run_blocking

log = logging.getLogger("psyche.server")

IDENTITY_FLAG = "--identity-secret-key-path"


def load_server_identity(path: Path | None) -> Identity:
    """The server's identity: from `path` (made there first when it does not exist, in a
    directory that must exist, and said so in the log), else a new one for this process."""
    if path is None:
        return Identity.generate()
    if not path.exists():
        if not path.parent.is_dir():
            raise click.BadParameter(
                f"{path}: the directory {path.parent} does not exist (check the path, or "
                "create the directory for a new key)",
                param_hint=IDENTITY_FLAG,
            )
        identity = Identity.generate()
        try:
            identity.save(path)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write a new key to {path}: {exc}", param_hint=IDENTITY_FLAG
            ) from exc
        log.warning(
            "no server key at %s: made a new one there (public key %s); clients started with "
            "another --server-key will refuse this server",
            path,
            identity.public_key.hex(),
            extra={"path": str(path), "server_key": identity.public_key.hex()},
        )
        return identity
    try:
        return Identity.load(path)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint=IDENTITY_FLAG) from exc


@click.command("run")
@options(RUN_FLAGS, from_environment=False)
def run(**values: object) -> None:
    """Run the coordinator server for the run described by --state."""
    tui = cast(bool | None, values["tui"])
    log_level = str(values["log_level"])
    log_file = cast(Path | None, values["log_file"])
    use_tui = sys.stdout.isatty() if tui is None else tui
    if use_tui and log_file is None:
        # The dashboard owns the terminal: logs go only to its Logs tab.
        logging.getLogger().setLevel(log_level.upper())
    else:
        try:
            setup_logging(cast(LogFormat, values["log_format"]), log_level, file=log_file)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot create {log_file} ({exc.strerror or exc}: {exc.filename})",
                param_hint="--log-file",
            ) from None
    identity = load_server_identity(cast(Path | None, values["identity_secret_key_path"]))
    request = RunRequest(
        cast(Path, values["state_path"]),
        server_options(values, identity),
        cast(Path | None, values["data_config"]),
        tui=use_tui,
    )
    raise SystemExit(run_blocking(request))
