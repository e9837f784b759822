"""`psyche-client authorize`: sign a delegation for a permissioned run, and the checks
`train --authorization FILE` makes on the file before it joins.

An authorizer (a key listed in the server's `--authorized-keys`) names delegate keys that may
join one run until an expiry; the statement's format is `psyche_common.protocol.authorization`.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import click
from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import (
    AuthorizationError,
    decode_authorization,
    encode_authorization,
    parse_public_key,
    sign_authorization,
)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\+(\d+)([smhdw])$")
_LATEST = datetime.max.replace(microsecond=0, tzinfo=UTC)
_LATEST_EXPIRY = int(_LATEST.timestamp())


def parse_expiry(text: str, now: float) -> int:
    """`+DURATION` (a number and one of s, m, h, d, w: `+7d`) from `now`, or an ISO 8601
    time (`2026-12-31T00:00:00Z`; without a zone: UTC); returns unix seconds. Raises
    ValueError naming the text."""
    text = text.strip()
    match = _DURATION.match(text)
    if match is not None:
        return int(now) + int(match.group(1)) * _UNITS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither +DURATION (+30m, +12h, +7d) nor an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def check_expiry(text: str, now: float) -> int:
    """`parse_expiry`, refusing a time that is past or beyond the last one a date can show
    (9999-12-31); raises ValueError naming the text."""
    expiry = parse_expiry(text, now)
    if expiry <= now:
        raise ValueError(f"{text!r} is in the past")
    if expiry > _LATEST_EXPIRY:
        raise ValueError(f"{text!r} is after {_LATEST.date().isoformat()}: give a nearer expiry")
    return expiry


def load_authorization(path: Path, identity: Identity, run_id: str) -> bytes:
    """The statement's bytes, once checked to be well formed, for `run_id` and naming this
    client's key (the server checks the rest: its authorizer, signature and expiry)."""
    try:
        data = path.read_bytes()
        statement = decode_authorization(data)
    except (OSError, AuthorizationError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--authorization") from exc
    if statement.run_id != run_id:
        raise click.BadParameter(
            f"{path} authorizes run {statement.run_id!r}, not {run_id!r}",
            param_hint="--authorization",
        )
    if identity.public_key not in statement.delegates:
        raise click.BadParameter(
            f"{path} does not name this client's key {identity.public_key.hex()} among its "
            f"{len(statement.delegates)} delegates",
            param_hint="--authorization",
        )
    return data


def _delegates(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[bytes, ...]:
    try:
        return tuple(parse_public_key(value) for value in values)
    except AuthorizationError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


@click.command("authorize")
@click.option(
    "--authorizer-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="the authorizer's secret key file (32 raw bytes or 64 hex characters); its public "
    "key must be in the server's --authorized-keys",
)
@click.option(
    "--delegate",
    "delegates",
    multiple=True,
    required=True,
    callback=_delegates,
    metavar="HEX",
    help="a delegate's public key (64 hex characters, `psyche-client show-identity`); repeat "
    "for several",
)
@click.option(
    "--expires",
    required=True,
    help="when the authorization ends: +DURATION (+30m, +12h, +7d) or an ISO 8601 time",
)
@click.option("--run-id", required=True, help="the run the delegates may join")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="where to write the signed authorization (give it to the delegates)",
)
def authorize(
    authorizer_key: Path, delegates: tuple[bytes, ...], expires: str, run_id: str, out: Path
) -> None:
    """Sign an authorization letting the delegate keys join RUN_ID until the expiry."""
    try:
        authorizer = Identity.load(authorizer_key)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{authorizer_key}: {exc}", param_hint="--authorizer-key") from exc
    try:
        expiry = check_expiry(expires, time.time())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires") from exc
    if not out.parent.is_dir():
        raise click.BadParameter(
            f"{out}: the directory {out.parent} does not exist", param_hint="--out"
        )
    try:
        statement = sign_authorization(authorizer, run_id.strip(), delegates, expiry)
    except AuthorizationError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        out.write_bytes(encode_authorization(statement))
    except OSError as exc:
        raise click.BadParameter(f"cannot write {out}: {exc}", param_hint="--out") from exc
    click.echo(
        f"wrote {out}: {authorizer.public_key.hex()} authorizes {len(delegates)} key(s) to "
        f"join run {run_id!r} until {datetime.fromtimestamp(expiry, UTC).isoformat()}"
    )
