"""`DummyBackend` sized like a real model (`--dummy-result-size`, `--dummy-model-size`): its
results and its shared model carry as many bytes as asked, and are still checked; its speed
(`--dummy-seconds-per-sample`): a batch of n samples sleeps n times the per-sample cost."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from psyche_client.cli import main
from psyche_client.training.backend import PADDING_PARAMETER, DummyBackend
from psyche_common.batch_id import BatchId


def test_results_have_the_asked_size_and_are_checked() -> None:
    backend = DummyBackend(0.0, result_size=63_386)
    batch = BatchId(0, 3)
    result = backend.train(4, batch, None, lambda: False)
    assert result is not None and len(result.payload) == 63_386 == backend.result_size()
    assert backend.decode(4, batch, result.payload, result.data_hash).payload == result.payload
    other = DummyBackend(0.0, result_size=63_386).train(4, BatchId(4, 7), None, lambda: False)
    assert other is not None and other.payload != result.payload
    with pytest.raises(ValueError, match="must be 63386 bytes"):
        backend.decode(4, batch, result.payload[:-1], result.data_hash)
    default = DummyBackend(0.0).train(4, batch, None, lambda: False)
    assert default is not None and len(default.payload) == DummyBackend.PAYLOAD_SIZE


def test_the_shared_model_carries_padding_derived_from_the_weights() -> None:
    size = 2 * PADDING_PARAMETER + 1000
    sharer = DummyBackend(0.0, model_size=size)
    sharer.apply(1, [])
    entries = {name: data for name, _, _, data in sharer.export_parameters()}
    padding = ["dummy.padding.0", "dummy.padding.1", "dummy.padding.2"]
    assert sorted(entries) == [*padding, "dummy.weights"]
    assert [len(entries[name]) for name in padding] == [PADDING_PARAMETER] * 2 + [1000]
    joiner = DummyBackend(0.0, model_size=size)
    joiner.load_parameters(entries)
    assert joiner.weights_hash() == sharer.weights_hash()
    forged = dict(entries, **{"dummy.padding.1": bytes(PADDING_PARAMETER)})
    with pytest.raises(ValueError, match="do not match its weights"):
        joiner.load_parameters(forged)
    missing = {k: v for k, v in entries.items() if k != "dummy.padding.1"}
    with pytest.raises(ValueError, match="do not match its weights"):
        joiner.load_parameters(missing)
    assert [name for name, *_ in DummyBackend(0.0).export_parameters()] == ["dummy.weights"]
    with pytest.raises(ValueError):
        DummyBackend(0.0, result_size=0)


def test_the_flags_reach_the_client_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import psyche_client.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda options, *_: seen.append(options) or 0)
    base = ["train", "--server-addr", "127.0.0.1:1", "--run-id", "x"]
    flags = ["--dummy-training-delay-secs", "0.1", "--dummy-result-size", "1000"]
    runner = CliRunner()
    assert runner.invoke(main, [*base, *flags, "--dummy-model-size", "5000"]).exit_code == 0
    assert runner.invoke(main, base).exit_code == 0
    assert [(o.backend.dummy_result_size, o.backend.dummy_model_size) for o in seen] == [
        (1000, 5000),
        (64, 0),
    ]


def test_a_batch_sleeps_its_samples_times_the_per_sample_cost() -> None:
    backend = DummyBackend(0.01, seconds_per_sample=0.02)
    started = time.monotonic()
    assert backend.train(1, BatchId(0, 9), None, lambda: False) is not None
    assert time.monotonic() - started >= 0.01 + 10 * 0.02
    started = time.monotonic()
    assert backend.train(1, BatchId(0, 0), None, lambda: False) is not None
    assert time.monotonic() - started < 0.01 + 10 * 0.02


def test_a_long_sleep_stops_when_its_round_is_cancelled() -> None:
    backend = DummyBackend(0.0, seconds_per_sample=10.0)
    started = time.monotonic()
    assert backend.train(1, BatchId(0, 99), None, lambda: time.monotonic() - started > 0.1) is None
    assert time.monotonic() - started < 5.0


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        DummyBackend(0.0, seconds_per_sample=-1.0)
