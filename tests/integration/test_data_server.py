"""The TCP data server: serves epoch members, rejects others, turns provider errors into replies."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import numpy as np
import pytest
from psyche_client.p2p.connection import dial_peer
from psyche_client.p2p.stats import TransferStats
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import RunState
from psyche_common.data import DataFetchError, DataIndexError
from psyche_common.data.factory import make_provider
from psyche_common.data.fetcher import DataSource, SampleFetcher
from psyche_common.data.local import LocalDataProvider
from psyche_common.data.retry import RetryPolicy
from psyche_common.data.server_client import DataServerProvider, data_server_provider_factory
from psyche_common.protocol import (
    ConnectionClosed,
    HandshakeError,
    Identity,
    connect_handshake,
    coordinator_domain,
    data_server_domain,
    read_frame,
    write_frame,
)
from psyche_common.protocol.handshake import mutual_transcript
from psyche_server.app import ServerOptions
from psyche_server.data_server import DataServer
from psyche_server.runner import RunRequest, StartupError, build_app

from bench.harness.protocol_client import start_clients
from tests.support.server_harness import poll_until, running_server, write_state

SEQ_LEN = 8
RUN = "data-run"


class FlakyProvider:
    """Wraps a provider; sample 13 makes it raise an unexpected error."""

    def __init__(self, inner: LocalDataProvider) -> None:
        self.inner = inner
        self.num_sequences = inner.num_sequences

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        if 13 in batch:
            raise RuntimeError("disk on fire")
        return await self.inner.get_samples(batch)


@pytest.fixture
def token_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tokens"
    directory.mkdir()
    np.arange(40 * SEQ_LEN + 3, dtype="<u2").tofile(directory / "part0.bin")
    return directory


async def test_data_server_serves_members_and_rejects_others(
    tmp_path: Path, token_dir: Path
) -> None:
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN, bytes(range(32)))
    data_server = DataServer(FlakyProvider(local), "127.0.0.1", 0, run_id=RUN)
    state = write_state(
        tmp_path / "s.toml",
        run_id=RUN,
        init_min_clients=2,
        warmup_time=30,
        data_location={"Server": "127.0.0.1:0"},
    )
    async with running_server(state, data_server=data_server) as app:
        outsider = DataServerProvider(
            f"127.0.0.1:{data_server.port}", Identity.generate(), SEQ_LEN, run_id=RUN
        )
        with pytest.raises(DataFetchError, match="NotInThisRound") as info:
            await outsider.get_samples(BatchId(0, 1))
        assert info.value.retryable

        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        member = await data_server_provider_factory(
            f"127.0.0.1:{data_server.port}", SEQ_LEN, clients[0].identity, RUN
        )
        samples = await member.get_samples(BatchId(0, 3))
        assert samples.dtype == np.int64 and samples.shape == (4, SEQ_LEN)
        np.testing.assert_array_equal(samples, local.read(BatchId(0, 3)))

        with pytest.raises(DataIndexError, match="OutOfRange"):
            await member.get_samples(BatchId(38, 45))
        with pytest.raises(DataFetchError, match=r"DataError.*disk on fire") as info:
            await member.get_samples(BatchId(12, 14))
        assert not info.value.retryable
        # the server survived and still serves, on the same connection
        np.testing.assert_array_equal(
            await member.get_samples(BatchId(20, 20)), local.read(BatchId(20, 20))
        )
        assert data_server.served[clients[0].id] == 5
        assert data_server.provided_samples == 5
        # the outsider is still refused while a run is going on
        with pytest.raises(DataFetchError, match="NotInThisRound"):
            await outsider.get_samples(BatchId(0, 0))
        await asyncio.gather(member.aclose(), outsider.aclose(), *(c.close() for c in clients))


async def test_make_provider_plugs_in_the_data_server_client(
    tmp_path: Path, token_dir: Path
) -> None:
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        provider = await make_provider(
            {"Server": f"127.0.0.1:{data_server.port}"},
            SEQ_LEN,
            identity=clients[0].identity,
            run_id=RUN,
            server_provider=data_server_provider_factory,
        )
        np.testing.assert_array_equal(
            await provider.get_samples(BatchId(2, 4)), local.read(BatchId(2, 4))
        )
        await provider.aclose()
        await clients[0].close()


async def test_the_sample_fetcher_reads_from_the_data_server_with_the_run_seq_len(
    tmp_path: Path, token_dir: Path
) -> None:
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        location = {"Server": f"127.0.0.1:{data_server.port}"}
        policy = RetryPolicy(attempts=2, delay_step=0)
        fetcher = SampleFetcher(DataSource(location, SEQ_LEN, RUN), clients[0].identity, policy)
        longer = SampleFetcher(DataSource(location, 2 * SEQ_LEN, RUN), clients[0].identity, policy)
        try:
            np.testing.assert_array_equal(await fetcher(BatchId(2, 4)), local.read(BatchId(2, 4)))
            await fetcher.aclose()  # the server takes one data connection per identity
            await poll_until(lambda: clients[0].id not in data_server.connections.connections)
            # a run whose max_seq_len differs from the served sequences is refused, not trained
            with pytest.raises(
                DataFetchError,
                match=rf"serves sequences of {SEQ_LEN} tokens, but this run's max_seq_len "
                rf"is {2 * SEQ_LEN}",
            ):
                await longer(BatchId(0, 0))
            assert data_server.served[clients[0].id] == 4  # refused once, not retried
        finally:
            await asyncio.gather(fetcher.aclose(), longer.aclose(), clients[0].close())


async def test_a_refused_connection_is_a_retryable_fetch_error(
    tmp_path: Path, token_dir: Path
) -> None:
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        address = f"127.0.0.1:{data_server.port}"
        first = DataServerProvider(address, clients[0].identity, SEQ_LEN, run_id=RUN)
        second = DataServerProvider(address, clients[0].identity, SEQ_LEN, run_id=RUN)
        try:
            await first.get_samples(BatchId(0, 0))
            # e.g. a restarted client whose old data connection the server still holds
            with pytest.raises(
                DataFetchError, match=r"refused the connection: identity \w+ is already connected"
            ) as info:
                await second.get_samples(BatchId(1, 1))
            assert info.value.retryable
            await first.aclose()
            await poll_until(lambda: clients[0].id not in data_server.connections.connections)
            np.testing.assert_array_equal(
                await second.get_samples(BatchId(1, 1)), local.read(BatchId(1, 1))
            )
        finally:
            await asyncio.gather(first.aclose(), second.aclose(), clients[0].close())


def test_server_data_location_needs_data_config(tmp_path: Path, token_dir: Path) -> None:
    state = write_state(
        tmp_path / "s.toml", data_location={"Server": "127.0.0.1:0"}, max_seq_len=SEQ_LEN
    )
    with pytest.raises(StartupError, match="no --data-config passed"):
        build_app(RunRequest(state, ServerOptions()))
    data_toml = tmp_path / "data.toml"
    data_toml.write_text(
        f'dir = "tokens"\ntoken_size = "TwoBytes"\nseq_len = {SEQ_LEN}\nshuffle_seed = {list(range(32))}\n'
    )
    app = build_app(RunRequest(state, ServerOptions(), data_config_path=data_toml))
    assert app.data_server is not None and app.data_server.total_samples == 40


async def test_a_relayed_p2p_handshake_cannot_log_in_to_the_data_server(
    tmp_path: Path, token_dir: Path
) -> None:
    """A member M hands the data server's challenge to a victim V that dials M over P2P and
    forwards V's signature: the data server refuses it, and V itself still logs in."""
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=2, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        victim, relay = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        refusals: list[object] = []

        async def relaying_listener(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
            ds_reader, ds_writer = await asyncio.open_connection("127.0.0.1", data_server.port)
            server_hello = await read_frame(ds_reader, timeout=5)
            challenge, ephemeral = server_hello["challenge"], server_hello["ephemeral"]
            await write_frame(
                writer, {"type": "Challenge", "challenge": challenge, "ephemeral": ephemeral}
            )
            hello = await read_frame(reader, timeout=5)
            mine = mutual_transcript(
                "listener",
                challenge,
                hello["challenge"],
                relay.id,
                hello["public_key"],
                ephemeral,
                hello["ephemeral"],
            )
            proof = {
                "type": "Proof",
                "public_key": relay.id,
                "signature": relay.identity.sign(mine),
            }
            await write_frame(writer, proof)
            dialer_proof = await read_frame(reader, timeout=5)
            forwarded = {
                **dialer_proof,
                "type": "ChallengeResponse",
                "ephemeral": hello["ephemeral"],
            }
            await write_frame(ds_writer, forwarded)
            with contextlib.suppress(ConnectionClosed):
                while True:
                    refusals.append(await read_frame(ds_reader, timeout=5))
            ds_writer.close()
            writer.close()

        listener = await asyncio.start_server(relaying_listener, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        async with listener:
            conn = await dial_peer(
                relay.id,
                "127.0.0.1",
                port,
                victim.identity,
                TransferStats(),
                connect_timeout=5,
                handshake_timeout=5,
                max_frame_size=1 << 20,
            )
            await poll_until(lambda: len(refusals) == 1)
            await conn.close()
        assert refusals[0]["type"] == "Rejected"
        assert "handshake with the data server of run" in refusals[0]["reason"]
        assert victim.id not in data_server.connections.connections
        # the victim is not locked out: its own connection works
        member = DataServerProvider(
            f"127.0.0.1:{data_server.port}", victim.identity, SEQ_LEN, run_id=RUN
        )
        np.testing.assert_array_equal(
            await member.get_samples(BatchId(0, 1)), local.read(BatchId(0, 1))
        )
        await asyncio.gather(member.aclose(), victim.close(), relay.close())


async def test_a_coordinator_signature_is_refused_by_the_data_server(
    tmp_path: Path, token_dir: Path
) -> None:
    data_server = DataServer(
        LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN), "127.0.0.1", 0, run_id=RUN
    )
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        reader, writer = await asyncio.open_connection("127.0.0.1", data_server.port)
        domain = coordinator_domain(app.run_id)
        with pytest.raises(
            HandshakeError, match=r"server rejected the connection.*does not verify"
        ):
            await connect_handshake(reader, writer, Identity.generate(), domain=domain, timeout=5)
        with pytest.raises(ConnectionClosed):
            await read_frame(reader, timeout=5)
        assert data_server.connections.connections == {}
        writer.close()


async def test_a_data_server_signature_for_another_run_is_refused(
    tmp_path: Path, token_dir: Path
) -> None:
    """The data-server handshake names the run: a member's signature made for another run's
    data server (or relayed from one) does not log in here."""
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        address = f"127.0.0.1:{data_server.port}"
        elsewhere = DataServerProvider(address, clients[0].identity, SEQ_LEN, run_id="other-run")
        with pytest.raises(
            DataFetchError, match=f"handshake with the data server of run '{RUN}' failed"
        ):
            await elsewhere.get_samples(BatchId(0, 0))
        assert clients[0].id not in data_server.connections.connections
        member = DataServerProvider(address, clients[0].identity, SEQ_LEN, run_id=RUN)
        np.testing.assert_array_equal(
            await member.get_samples(BatchId(0, 0)), local.read(BatchId(0, 0))
        )
        await asyncio.gather(elsewhere.aclose(), member.aclose(), clients[0].close())


async def test_with_the_server_key_only_that_server_serves(tmp_path: Path, token_dir: Path) -> None:
    """`--server-key` reaches the data server too: the server's own key is accepted, another
    one is a final (not retried) error naming both keys."""
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    server_identity = Identity.generate()
    data_server = DataServer(local, "127.0.0.1", 0, run_id=RUN, identity=server_identity)
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        location = {"Server": f"127.0.0.1:{data_server.port}"}
        provider = await make_provider(
            location,
            SEQ_LEN,
            identity=clients[0].identity,
            run_id=RUN,
            server_key=server_identity.public_key,
        )
        np.testing.assert_array_equal(
            await provider.get_samples(BatchId(0, 1)), local.read(BatchId(0, 1))
        )
        expected = Identity.generate().public_key
        impostor = await make_provider(
            location, SEQ_LEN, identity=clients[0].identity, run_id=RUN, server_key=expected
        )
        with pytest.raises(DataFetchError, match=f"not the expected {expected.hex()}") as raised:
            await impostor.get_samples(BatchId(0, 1))
        assert not raised.value.retryable
        await asyncio.gather(provider.aclose(), impostor.aclose(), clients[0].close())


async def test_no_key_holds_a_data_server_slot_for_ever(tmp_path: Path, token_dir: Path) -> None:
    """Admission at the handshake and timeouts: a key that is no epoch member is closed right
    after its handshake (it never holds a slot), a member that sends nothing is closed at the
    first-request timeout, a member silent between requests at the idle timeout; a member
    reconnects on its next request."""
    local = LocalDataProvider(token_dir, "TwoBytes", SEQ_LEN)
    data_server = DataServer(
        local, "127.0.0.1", 0, run_id=RUN, first_request_timeout=0.5, idle_timeout=1.0
    )
    state = write_state(tmp_path / "s.toml", run_id=RUN, init_min_clients=1, warmup_time=30)
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(1, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        domain = data_server_domain(RUN)

        async def squat(identity: Identity) -> float:
            """Handshake, send nothing; the seconds until the server closes the link."""
            reader, writer = await asyncio.open_connection("127.0.0.1", data_server.port)
            channel = await connect_handshake(reader, writer, identity, domain=domain, timeout=5)
            started = asyncio.get_running_loop().time()
            try:
                while True:
                    frame = await channel.read(1 << 16, timeout=5)
                    assert frame["type"] == "Rejected" and "NotInThisRound" in frame["reason"]
            except ConnectionClosed:
                return asyncio.get_running_loop().time() - started
            finally:
                writer.close()

        assert await squat(Identity.generate()) < 0.4  # an outsider: closed at once
        assert 0.4 < await squat(clients[0].identity) < 3  # a member sending nothing
        member = DataServerProvider(
            f"127.0.0.1:{data_server.port}", clients[0].identity, SEQ_LEN, run_id=RUN
        )
        try:
            await member.get_samples(BatchId(0, 0))
            await poll_until(lambda: data_server.connections.connections == {}, timeout=5)
            with contextlib.suppress(DataFetchError):  # the closed link is noticed on use
                await member.get_samples(BatchId(1, 1))
            np.testing.assert_array_equal(
                await member.get_samples(BatchId(1, 1)), local.read(BatchId(1, 1))
            )
        finally:
            await asyncio.gather(member.aclose(), clients[0].close())
