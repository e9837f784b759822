"""The server's WeightsMismatch notice puts the client out of sync (it resyncs at Warmup)."""

from __future__ import annotations

from psyche_client.app import ClientApp, ClientOptions, ServerOptions
from psyche_client.round.context import RoundContext
from psyche_client.weights.backends import BackendOptions
from psyche_common.protocol import Identity
from psyche_common.protocol.messages import WeightsMismatch

from tests.support.runners import lone_runner


def make_app() -> tuple[ClientApp, RoundContext]:
    identity = Identity.generate()
    app = ClientApp(
        ClientOptions(
            ServerOptions("127.0.0.1:1", "run"),
            identity,
            backend=BackendOptions(dummy_delay_secs=0),
        )
    )
    app.runner = lone_runner(identity, stats=app.stats)
    return app, app.runner.ctx


def test_a_mismatch_notice_for_our_weights_puts_us_out_of_sync() -> None:
    app, ctx = make_app()
    app.stats.weights_hashes[7] = b"m" * 32
    app._on_weights_mismatch(WeightsMismatch(step=7, majority_hash=b"M" * 32))
    assert ctx.out_of_sync is not None and "step 7" in ctx.out_of_sync
    assert app.stats.sync_status.startswith("out of sync")


def test_a_stale_notice_about_weights_we_already_fixed_is_ignored() -> None:
    app, ctx = make_app()
    app.stats.weights_hashes[7] = b"M" * 32  # resynced since: we now hold the majority's
    app._on_weights_mismatch(WeightsMismatch(step=7, majority_hash=b"M" * 32))
    assert ctx.out_of_sync is None
