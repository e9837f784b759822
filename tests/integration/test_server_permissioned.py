"""A permissioned run (`--authorized-keys`) on a real in-process server: listed keys and valid
delegates join; unlisted keys, expired, forged and foreign authorizations are refused with a
Rejected naming the reason; the file is re-read while the server runs (an added key can then
join, a removed one is closed unless it is an epoch member, a broken file keeps the old list
for the clients admitted and refuses every new Join until it is fixed);
a bad file stops the start-up naming its line."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from psyche_common.coordinator.types import RunState
from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import (
    decode_authorization,
    encode_authorization,
    sign_authorization,
)
from psyche_common.protocol.framing import encode_payload
from psyche_server.options import ServerOptions
from psyche_server.runner import RunRequest, StartupError, build_app

from bench.harness.protocol_client import ProtocolClient
from tests.support.server_harness import poll_until, running_server, write_state


def _write_keys(path: Path, *keys: bytes) -> Path:
    lines = ["# permissioned test run", *(key.hex() for key in keys), ""]
    path.write_text("\n".join(lines))
    stat = path.stat()  # a new mtime even within the filesystem's timestamp granularity
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    return path


async def _refused(client: ProtocolClient, **connect: object) -> str:
    await client.connect(**connect)  # type: ignore[arg-type]
    await client.wait_closed()
    assert client.rejected is not None, client.closed_reason
    assert client.states_received == 0
    return client.rejected


async def test_listed_delegated_and_refused_joins(tmp_path: Path) -> None:
    listed, authorizer, delegate = Identity.generate(), Identity.generate(), Identity.generate()
    keys = _write_keys(tmp_path / "keys", listed.public_key, authorizer.public_key)
    state = write_state(tmp_path / "s.toml", init_min_clients=5)
    async with running_server(state, authorized_keys=keys) as app:
        run = app.run_id
        expires = int(time.time()) + 3600
        statement = sign_authorization(authorizer, run, [delegate.public_key], expires)
        good = encode_authorization(statement)

        member = await ProtocolClient(app.port, run, listed, auto=False).connect()
        await member.wait_for(lambda c: True)
        delegated = ProtocolClient(app.port, run, delegate, auto=False)
        await delegated.connect(authorization=good)
        await delegated.wait_for(lambda c: True)
        assert list(app.pending) == [listed.public_key, delegate.public_key]

        stranger = ProtocolClient(app.port, run, auto=False)
        reason = await _refused(stranger)
        assert reason.startswith("not authorized: ") and stranger.id.hex() in reason

        expired = encode_authorization(
            sign_authorization(authorizer, run, [delegate.public_key], int(time.time()) - 10)
        )
        late = ProtocolClient(app.port, run, delegate, auto=False)
        await delegated.close()
        await poll_until(lambda: delegate.public_key not in app.connections.connections)
        assert "authorization expired at" in await _refused(late, authorization=expired)

        intruder = Identity.generate()
        forged = encode_payload(
            {
                "version": 1,
                "run_id": run,
                "authorizer": authorizer.public_key,
                "delegates": [intruder.public_key],
                "expires": expires,
                "signature": statement.signature,
            }
        )
        reason = await _refused(
            ProtocolClient(app.port, run, intruder, auto=False), authorization=forged
        )
        assert "signature does not verify" in reason

        outsider = Identity.generate()  # signs for others, but is not listed itself
        foreign = encode_authorization(
            sign_authorization(outsider, run, [intruder.public_key], expires)
        )
        reason = await _refused(
            ProtocolClient(app.port, run, intruder, auto=False), authorization=foreign
        )
        assert "not in the server's authorized keys" in reason

        other_run = encode_authorization(
            sign_authorization(authorizer, "another-run", [intruder.public_key], expires)
        )
        reason = await _refused(
            ProtocolClient(app.port, run, intruder, auto=False), authorization=other_run
        )
        assert "'another-run'" in reason
        assert list(app.pending) == [listed.public_key]  # none of the refused joined
        assert app.admission is not None and app.admission.refused == 5
        await member.close()


async def test_one_authorizer_cannot_seat_an_army(tmp_path: Path) -> None:
    """`--max-delegates-per-authorizer`: a listed key's delegates beyond the cap are refused
    across its statements; an over-long expiry is refused; listed keys are seated first, a
    delegate votes with its authorizer, and the state broadcast names each delegate member's
    authorizer (the clients' votes count one per listed key)."""
    listed, authorizer = Identity.generate(), Identity.generate()
    keys = _write_keys(tmp_path / "keys", listed.public_key, authorizer.public_key)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    army = [Identity.generate() for _ in range(3)]
    async with running_server(
        state, authorized_keys=keys, max_delegates_per_authorizer=2, max_authorization_days=7
    ) as app:
        run = app.run_id
        expires = int(time.time()) + 3600
        joined = []
        for identity in army[:2]:  # one statement each: the cap counts across statements
            grant = encode_authorization(
                sign_authorization(authorizer, run, [identity.public_key], expires)
            )
            client = await ProtocolClient(app.port, run, identity, auto=False).connect(
                authorization=grant
            )
            await client.wait_for(lambda c: True)
            joined.append(client)
        third = encode_authorization(
            sign_authorization(authorizer, run, [army[2].public_key], expires)
        )
        reason = await _refused(
            ProtocolClient(app.port, run, army[2], auto=False), authorization=third
        )
        assert "already has 2 delegates" in reason and "--max-delegates-per-authorizer" in reason
        forever = encode_authorization(
            sign_authorization(authorizer, run, [army[2].public_key], 2**62)
        )
        reason = await _refused(
            ProtocolClient(app.port, run, army[2], auto=False), authorization=forever
        )
        assert "--max-authorization-days" in reason
        member = await ProtocolClient(app.port, run, listed, auto=False).connect()
        await member.wait_for(lambda c: True)
        assert app.admission is not None
        assert app.admission.seat_order(app.pending) == [
            listed.public_key,
            *(identity.public_key for identity in army[:2]),
        ]
        assert app.admission.voter(army[0].public_key) == authorizer.public_key
        await poll_until(lambda: app.run_state == RunState.Warmup)
        delegated = {identity.public_key: authorizer.public_key for identity in army[:2]}
        await poll_until(lambda: member.authorizers == delegated)
        for client in (*joined, member):
            await client.close()


async def test_open_run_takes_anyone(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=5)
    async with running_server(state) as app:
        assert app.admission is None
        client = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await client.wait_for(lambda c: True)
        await client.close()


async def test_the_file_is_reloaded_while_the_server_runs(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    early, late, spare = Identity.generate(), Identity.generate(), Identity.generate()
    keys = _write_keys(tmp_path / "keys", early.public_key, spare.public_key)
    state = write_state(tmp_path / "s.toml", init_min_clients=5)
    async with running_server(state, authorized_keys=keys) as app:
        assert "not authorized" in await _refused(
            ProtocolClient(app.port, app.run_id, late, auto=False)
        )
        first = await ProtocolClient(app.port, app.run_id, early, auto=False).connect()
        await first.wait_for(lambda c: True)

        _write_keys(
            keys, early.public_key, late.public_key, spare.public_key
        )  # add a key: it can join now
        assert app.admission is not None
        await poll_until(lambda: late.public_key in app.admission.keys.keys, timeout=10)
        second = await ProtocolClient(app.port, app.run_id, late, auto=False).connect()
        await second.wait_for(lambda c: True)

        keys.write_text(f"{late.public_key.hex()}\nnot-a-key\n")  # broken: the list stays
        stat = keys.stat()
        os.utime(keys, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        await poll_until(lambda: "line 2" in caplog.text, timeout=10)
        assert app.admission.keys.keys == {early.public_key, late.public_key, spare.public_key}
        assert first.connected  # `early`, removed in the broken file, is not revoked
        # ... but no new Join is admitted, naming the file and the fault
        reason = await _refused(ProtocolClient(app.port, app.run_id, spare, auto=False))
        assert "authorized-keys file keys does not load" in reason and "line 2" in reason
        assert str(keys.parent) not in reason  # the fault, not where the server keeps it

        # remove `early`: not an epoch member (the run waits for 5), so it is closed now
        keys = _write_keys(keys, late.public_key, spare.public_key)
        await first.wait_closed(timeout=10)
        assert first.rejected is not None and "removed from the server's authorized keys" in (
            first.rejected
        )
        assert list(app.pending) == [late.public_key] and second.connected
        third = await ProtocolClient(app.port, app.run_id, spare, auto=False).connect()
        await third.wait_for(lambda c: True)  # the file loads again: new Joins are admitted
        await third.close()
        await second.close()


async def test_removed_members_stay_until_their_epoch_ends(tmp_path: Path) -> None:
    clients = [Identity.generate() for _ in range(2)]
    keys = _write_keys(tmp_path / "keys", *(c.public_key for c in clients))
    state = write_state(tmp_path / "s.toml", init_min_clients=2, epoch_time=60)
    async with running_server(state, authorized_keys=keys) as app:
        a = await ProtocolClient(app.port, app.run_id, clients[0]).connect()
        b = await ProtocolClient(app.port, app.run_id, clients[1]).connect()
        await a.wait_for(lambda c: c.run_state == RunState.RoundTrain, timeout=30)
        _write_keys(keys, clients[1].public_key)
        assert app.reload_authorized_keys()  # as on SIGHUP
        assert clients[0].public_key in app.membership.revoked
        assert clients[0].public_key not in app.pending  # not in the next epoch
        step = a.coordinator.progress.step if a.coordinator else 0
        await a.wait_for(lambda c: c.progress.step >= step + 1, timeout=30)  # still training
        assert a.connected and a.rejected is None
        await a.close()
        await b.close()


def test_a_bad_file_stops_the_start_naming_the_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# ok\n{'ab' * 32}\n{'ab' * 31}\n")
    state = write_state(tmp_path / "s.toml")
    request = RunRequest(state, ServerOptions(authorized_keys=keys))
    with pytest.raises(StartupError, match=r"keys line 3: .* is not a public key"):
        build_app(request)
    keys.write_text(f"{'ab' * 32}\n")
    assert build_app(request).admission is not None


def test_decoded_statement_round_trips() -> None:
    authorizer = Identity.generate()
    statement = sign_authorization(authorizer, "r", [bytes([7] * 32)], 10)
    assert decode_authorization(encode_authorization(statement)) == statement
