"""End-to-end: the coordinator link is encrypted and authenticated, with real processes.

Three dummy clients train a short run. Two connect straight to the server; the third goes
through a test-only TCP proxy that records every byte and, after the handshake, flips one
byte of its first connection's `Join` (client → server) and one byte of a state frame on its
second connection (server → client). Each altered frame fails authentication: the side that
read it closes the link, logging the peer, and the client reconnects; all three then train
the run to its end with identical weights. The recorded bytes show no protocol content after
the handshake (not the run id, no message type). A fourth client given another server key
(`--server-key`) refuses the server and exits 1 with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from psyche_common.protocol import Identity

from bench.harness.client_run import Cluster, finish_in_agreement, wait_for, write_state
from bench.harness.tamper_proxy import DOWN, UP, Flip, TamperProxy

pytestmark = pytest.mark.timeout(300)

PROTOCOL_STRINGS = (
    b"e2e-run",
    b"CoordinatorState",
    b"Join",
    b"Witness",
    b"HealthCheck",
    b"Reachability",
    b"run_state",
    b"epoch_state",
    b"p2p_address",
    b"127.0.0.1:",
)


def test_flipped_bytes_are_refused_and_the_wire_shows_nothing(tmp_path: Path) -> None:
    server_key_file = tmp_path / "server.key"
    server_identity = Identity.generate()
    server_key_file.write_bytes(server_identity.secret_bytes())
    server_key = server_identity.public_key.hex()
    cluster = Cluster(
        tmp_path,
        write_state(
            tmp_path / "state.toml",
            total_steps=7,
            init_min_clients=3,
            min_clients=3,
            warmup_time=30,
            max_round_train_time=6,
        ),
    )
    # up: ChallengeResponse (0), Join (1); down: Challenge (0), Welcome (1), Reachability or
    # a state (2, 3, ...)
    flips = [Flip(0, UP, 1), Flip(1, DOWN, 3)]
    proxy = TamperProxy(cluster.port, flips)
    try:
        server = cluster.start_server("--identity-secret-key-path", str(server_key_file))
        proxy.start()
        wait_for(
            lambda: f"psyche-server key {server_key}" in server.log_path.read_text(),
            30,
            "the server to print its key",
            cluster.diagnostics,
        )
        wrong = cluster.start_client(
            "--server-key", Identity.generate().public_key.hex(), dummy_delay=0.2
        )
        direct = [
            cluster.start_client("--server-key", server_key, dummy_delay=0.2) for _ in range(2)
        ]
        proxied = cluster.start_client(
            "--server-key",
            server_key,
            "--server-addr",
            f"127.0.0.1:{proxy.port}",
            dummy_delay=0.2,
        )
        wait_for(lambda: wrong.popen.poll() is not None, 60, "the refusal", cluster.diagnostics)
        assert wrong.popen.returncode == 1, cluster.diagnostics()
        refusal = wrong.log_path.read_text()
        assert f"the server's key is {server_key}, not the expected" in refusal, refusal[-2000:]
        assert "reconnecting" not in refusal

        finish_in_agreement(cluster, [*direct, proxied], min_common=3)
        assert proxy.flipped == flips, proxy.flipped
        assert len(proxy.captures) >= 3  # the two altered connections and the one that trained
        server_log = server.log_path.read_text()
        assert f"closing the link of {proxied_id(proxied)}" in server_log
        assert "failed authentication" in server_log
        client_log = proxied.log_path.read_text()
        assert "closing the link to the server: frame" in client_log
        assert "failed authentication" in client_log
        assert "reconnected to the server" in client_log
        for capture in proxy.captures:
            wire = capture.after_handshake()
            assert wire, "nothing was recorded after the handshake"
            for text in PROTOCOL_STRINGS:
                assert text not in wire, f"{text!r} is readable after the handshake"
            assert b"e2e-run" not in capture.handshake()  # the run id is only signed, never sent
    finally:
        cluster.stop()
        proxy.stop()


def proxied_id(proc: object) -> str:
    """The short id of a client, from its log."""
    from bench.harness.client_run import Proc

    assert isinstance(proc, Proc)
    for line in proc.log_path.read_text().splitlines():
        if "connected to server" in line and " as " in line:
            return line.split(" as ", 1)[1].split('"', 1)[0].strip()
    raise AssertionError(f"no 'connected to server' line in {proc.log_path}")
