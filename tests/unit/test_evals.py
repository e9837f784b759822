"""Evals during training: the lm-eval adapter on a tiny model with tiny task files, the model
access that lends the live model only while the pipeline is idle, the held-out loss, and the
scores a witness report carries."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from psyche_client.evals.access import ModelAccess, WeightsChanged
from psyche_client.evals.adapter import ModelLM
from psyche_client.evals.harness import run_tasks, scores_from_results, task_manager
from psyche_client.evals.heldout import (
    NoHeldOutSplit,
    heldout_loss,
    heldout_sequences,
    token_losses,
)
from psyche_client.evals.tokenizer import ByteTokenizer, NoTokenizer, tokenizer_for
from psyche_client.round.stats import HELDOUT_LOSS, ClientStats
from psyche_client.training.backend import Capabilities
from psyche_client.training.model.loading import load_model
from psyche_common.config import BuiltinData, LocalData

from bench.support.eval_tasks import DOCS, write_tasks


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    loaded, _ = load_model("builtin:llama-tiny")
    return loaded


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"), ("tiny_mc", "tiny_mc_b"))


@pytest.fixture(autouse=True)
def _offline_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))


def _direct(model: torch.nn.Module, work):  # type: ignore[no-untyped-def]
    model.eval()
    with torch.no_grad():
        return work(model)


def _choice_logprob(model: torch.nn.Module, context: str, continuation: str) -> float:
    """log p(continuation | context) straight from the model (byte tokens)."""
    ids = list((context + continuation).encode())
    start = len(context.encode())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
    return float(sum(logprobs[i - 1, ids[i]] for i in range(start, len(ids))))


def test_task_accuracy_is_the_models_own_choice(model: torch.nn.Module, tasks_dir: Path) -> None:
    manager = task_manager(("tiny_mc",), tasks_dir)
    lm = ModelLM(lambda work: _direct(model, work), ByteTokenizer(), 64, batch_size=2)
    scores = run_tasks(lm, ("tiny_mc",), 0, 42, None, manager)
    expected = np.mean(
        [
            int(
                np.argmax([_choice_logprob(model, d["question"], " " + c) for c in d["choices"]])
                == d["answer"]
            )
            for d in DOCS
        ]
    )
    assert scores.metrics["tiny_mc/acc"] == pytest.approx(expected)
    assert scores.primary["tiny_mc"] == scores.metrics["tiny_mc/acc_norm"]
    again = run_tasks(lm, ("tiny_mc",), 0, 42, None, manager)
    assert again == scores  # deterministic


def test_max_docs_and_fewshot_reach_lm_eval(model: torch.nn.Module, tasks_dir: Path) -> None:
    manager = task_manager(("tiny_mc",), tasks_dir)
    seen: list[int] = []

    def run(work):  # type: ignore[no-untyped-def]
        return _direct(model, work)

    class Counting(ModelLM):
        def loglikelihood(self, requests):  # type: ignore[no-untyped-def]
            seen.append(len(requests))
            contexts.extend(r.args[0] for r in requests)
            return super().loglikelihood(requests)

    contexts: list[str] = []
    lm = Counting(run, ByteTokenizer(), 256, batch_size=4)
    run_tasks(lm, ("tiny_mc",), 2, 7, 2, manager)
    assert seen == [2 * 3]  # two documents of three choices
    assert all(context.count("\n\n") == 2 for context in contexts)  # two few-shot examples


def test_unknown_task_is_named(tasks_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"nope_task: not in lm-eval or in"):
        task_manager(("tiny_mc", "nope_task"), tasks_dir, include_defaults=False)


def test_long_contexts_are_cut_from_the_left() -> None:
    lm = ModelLM(lambda work: None, ByteTokenizer(), 8, batch_size=1)
    context, continuation = lm.encode_pair("x" * 20, " ab")
    assert len(context) + len(continuation) == 9
    assert bytes(continuation) == b" ab"


def test_scores_from_results_skips_stderr_and_counts() -> None:
    scores = scores_from_results(
        {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": "N/A", "sample_len": 3}}
    )
    assert scores.metrics == {"t/acc": 0.5}
    assert scores.primary == {"t": 0.5}


def test_tokenizer_choice(tmp_path: Path) -> None:
    assert isinstance(tokenizer_for(256, []), ByteTokenizer)
    with pytest.raises(NoTokenizer, match=r"tokenizer\.json"):
        tokenizer_for(32000, [])


# ---------------------------------------------------------------- the live model, lent


class _Backend:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.digest = b"a" * 32
        self.capabilities = Capabilities(live_model=self.live_model)

    def live_model(self) -> torch.nn.Module:
        return self.model

    def weights_hash(self) -> bytes:
        return self.digest


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


async def test_access_leaves_the_model_as_it_was(model: torch.nn.Module) -> None:
    model.train()
    before = _params(model)
    backend = _Backend(model)
    access = ModelAccess(asyncio.get_running_loop(), asyncio.Lock(), lambda: True, lambda: backend)
    modes: list[bool] = []

    def work(m: torch.nn.Module) -> float:
        modes.append(m.training)
        modes.append(torch.is_grad_enabled())
        return token_losses(m, np.arange(64).reshape(2, 32) % 256)[0]

    first = await asyncio.to_thread(access.run, work)
    second = await asyncio.to_thread(access.run, work)
    assert first == second
    assert modes == [False, False, False, False]
    assert model.training
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))
    assert all(p.grad is None for p in model.parameters())


async def test_access_waits_for_idle_and_for_the_model_lock(model: torch.nn.Module) -> None:
    idle = threading.Event()
    lock = asyncio.Lock()
    backend = _Backend(model)
    access = ModelAccess(asyncio.get_running_loop(), lock, idle.is_set, lambda: backend)
    piece = asyncio.ensure_future(asyncio.to_thread(access.run, lambda m: "ran"))
    await asyncio.sleep(0.3)
    assert not piece.done()  # the pipeline is busy
    await lock.acquire()  # training holds the model
    idle.set()
    await asyncio.sleep(0.3)
    assert not piece.done()
    lock.release()
    assert await asyncio.wait_for(piece, 5) == "ran"
    assert not lock.locked()


async def test_changed_weights_abandon_the_eval(model: torch.nn.Module) -> None:
    backend = _Backend(model)
    access = ModelAccess(asyncio.get_running_loop(), asyncio.Lock(), lambda: True, lambda: backend)
    access.begin()
    await asyncio.to_thread(access.run, lambda m: None)
    backend.digest = b"b" * 32  # a round applied its results between two pieces
    with pytest.raises(WeightsChanged):
        await asyncio.to_thread(access.run, lambda m: None)
    access.begin()  # started again: pinned to the new weights
    await asyncio.to_thread(access.run, lambda m: None)
    assert access.pinned == b"b" * 32


# ---------------------------------------------------------------- held-out loss


def test_heldout_loss_is_the_mean_token_loss(model: torch.nn.Module) -> None:
    sequences = heldout_sequences(BuiltinData(name="python-stdlib"), 32, 5)
    assert sequences.shape == (5, 32)
    again = heldout_sequences(BuiltinData(name="python-stdlib"), 32, 5)
    assert np.array_equal(sequences, again)
    loss = heldout_loss(lambda work: _direct(model, work), sequences, batch_size=2)
    with torch.no_grad():
        batch = torch.from_numpy(sequences)
        direct = model(input_ids=batch, labels=batch).loss
    assert loss == pytest.approx(float(direct), rel=1e-5)
    assert math.isfinite(loss)


def test_heldout_needs_a_split() -> None:
    with pytest.raises(NoHeldOutSplit, match="held-out split"):
        heldout_sequences(LocalData(path="/data"), 32, 4)


# ---------------------------------------------------------------- what a witness reports


def test_witness_report_carries_at_most_eight_short_names() -> None:
    stats = ClientStats()
    stats.record_evals(3, {f"task_{i}_" + "x" * 40: i / 10 for i in range(9)})
    stats.record_evals(4, {HELDOUT_LOSS: 2.5, "nan_task": math.nan})
    reported = stats.witness_metadata(4, b"h" * 32)["evals"]
    assert len(reported) == 8
    assert next(iter(reported)) == HELDOUT_LOSS
    assert all(len(name) <= 32 for name in reported)
    assert "nan_task" not in reported
    assert stats.eval_steps[HELDOUT_LOSS] == 4


def test_an_eval_thread_outliving_its_event_loop_ends_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from psyche_client.evals.scheduler import in_daemon_thread

    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    release, finished = threading.Event(), threading.Event()

    def work() -> str:
        release.wait(5)
        finished.set()
        return "late"

    async def start_and_leave() -> None:
        task = asyncio.ensure_future(in_daemon_thread(work))
        await asyncio.sleep(0.05)
        task.cancel()  # the client closes while the eval still runs

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start_and_leave())
    loop.close()
    release.set()
    assert finished.wait(5)
    time.sleep(0.2)
    assert errors == []


def test_eval_scores_reach_the_clients_metrics_sink() -> None:
    from psyche_client.app import ClientApp, ClientOptions, ServerOptions
    from psyche_client.evals.options import EvalOptions
    from psyche_client.evals.scheduler import EvalOutcome
    from psyche_common.protocol import Identity

    from tests.unit.test_client_metrics import RecordingSink

    app = ClientApp(
        ClientOptions(
            ServerOptions("127.0.0.1:1", "run"),
            Identity.generate(),
            evals=EvalOptions(tasks=("tiny_mc",), heldout_every=1),
        )
    )
    sink = RecordingSink()
    app.metrics.sink = sink
    assert app.evals is not None
    scores = {"tiny_mc": 0.4}
    app.evals._record(6, EvalOutcome("lm-eval", scores, {"tiny_mc/acc": 0.2}, b"w" * 32))
    app.evals._record(7, EvalOutcome("heldout", {HELDOUT_LOSS: 2.0}, {HELDOUT_LOSS: 2.0}, None))
    assert sink.entries == [
        (6, {"eval/tiny_mc": 0.4, "eval/tiny_mc/acc": 0.2}),
        (7, {"eval/heldout_loss": 2.0}),
    ]
    assert app.stats.evals == {"tiny_mc": 0.4, HELDOUT_LOSS: 2.0}


def test_a_client_without_evals_never_imports_lm_eval() -> None:
    import subprocess
    import sys

    code = "import sys, psyche_client.cli, psyche_client.app.app; print('lm_eval' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr
