"""End-to-end: a permissioned run (`psyche-server run --authorized-keys`) with real processes.

Two dummy clients train the run to its end with identical weights: one whose key is listed,
one admitted by a delegation that a listed authorizer signed with `psyche-client authorize`.
Three intruders are refused at their Join and exit non-zero at once (no reconnecting),
printing the server's reason: a key that is not listed, a delegate whose authorization
expired, and a key that presents a forged authorization (a listed authorizer's statement with
its own key put among the delegates, so the signature no longer verifies).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import pytest
from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import encode_authorization, sign_authorization

from bench.harness.client_run import BIN, Cluster, applied_hashes, wait_for, write_state

pytestmark = pytest.mark.timeout(300)


def _key_file(path: Path) -> Identity:
    identity = Identity.generate()
    path.write_bytes(identity.secret_bytes())
    return identity


def test_listed_and_delegated_clients_train_an_unlisted_one_is_refused(tmp_path: Path) -> None:
    listed, authorizer, delegate = (
        _key_file(tmp_path / name) for name in ("listed.key", "authorizer.key", "delegate.key")
    )
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"# e2e run\n{listed.public_key.hex()}\n{authorizer.public_key.hex()}  # authorizer\n"
    )
    statement = tmp_path / "delegate.auth"
    signed = subprocess.run(
        [
            str(BIN / "psyche-client"),
            "authorize",
            "--authorizer-key",
            str(tmp_path / "authorizer.key"),
            "--delegate",
            delegate.public_key.hex(),
            "--expires",
            "+1h",
            "--run-id",
            "e2e-run",
            "--out",
            str(statement),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert signed.returncode == 0, signed.stderr
    expired_key, forger = (_key_file(tmp_path / name) for name in ("expired.key", "forger.key"))
    expired = sign_authorization(
        authorizer, "e2e-run", [expired_key.public_key], int(time.time()) - 60
    )
    (tmp_path / "expired.auth").write_bytes(encode_authorization(expired))
    genuine = sign_authorization(
        authorizer, "e2e-run", [delegate.public_key], int(time.time()) + 3600
    )
    forged = dataclasses.replace(genuine, delegates=(*genuine.delegates, forger.public_key))
    (tmp_path / "forged.auth").write_bytes(encode_authorization(forged))
    cluster = Cluster(
        tmp_path,
        write_state(
            tmp_path / "state.toml",
            total_steps=7,
            init_min_clients=2,
            min_clients=2,
            warmup_time=30,
            max_round_train_time=6,
        ),
    )
    try:
        cluster.start_server("--authorized-keys", str(keys))
        stranger = cluster.start_client(dummy_delay=0.2)
        intruders = {
            "authorization expired at": cluster.start_client(
                "-i",
                str(tmp_path / "expired.key"),
                "--authorization",
                str(tmp_path / "expired.auth"),
                dummy_delay=0.2,
            ),
            "authorization signature does not verify": cluster.start_client(
                "-i",
                str(tmp_path / "forger.key"),
                "--authorization",
                str(tmp_path / "forged.auth"),
                dummy_delay=0.2,
            ),
        }
        members = [
            cluster.start_client("-i", str(tmp_path / "listed.key"), dummy_delay=0.2),
            cluster.start_client(
                "-i",
                str(tmp_path / "delegate.key"),
                "--authorization",
                str(statement),
                dummy_delay=0.2,
            ),
        ]
        wait_for(lambda: stranger.popen.poll() is not None, 60, "the refusal", cluster.diagnostics)
        assert stranger.popen.returncode == 1, cluster.diagnostics()
        output = stranger.log_path.read_text()
        assert "server rejected this client: not authorized" in output, output[-2000:]
        assert "reconnecting" not in output
        for reason, intruder in intruders.items():
            wait_for(lambda p=intruder: p.popen.poll() is not None, 60, reason, cluster.diagnostics)
            assert intruder.popen.returncode == 1, cluster.diagnostics()
            output = intruder.log_path.read_text()
            assert "server rejected this client: not authorized" in output, output[-2000:]
            assert reason in output, output[-2000:]
            assert "reconnecting" not in output
        wait_for(
            lambda: all(p.popen.poll() is not None for p in members),
            200,
            "the members to finish the run",
            cluster.diagnostics,
        )
        assert [p.popen.returncode for p in members] == [0, 0], cluster.diagnostics()
        tables = [applied_hashes(p) for p in members]
        common = sorted(set(tables[0]) & set(tables[1]))
        assert len(common) >= 3 and all(tables[0][s] == tables[1][s] for s in common)
    finally:
        cluster.stop()
