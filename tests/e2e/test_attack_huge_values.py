"""A huge-values trainer in a bf16 run (real processes, the tiny real model).

Four clients train `builtin:llama-tiny` with bf16 result values (`quantize_1bit = false`) and
no verifiers; one of them is tests/e2e/huge_client.py, which multiplies every value it sends
by 1e30 (finite in bf16). Its results pass the strict decode and are applied, but each
client first normalises every result's values per tensor to the lower median RMS of the
step's results (`psyche_client.distro.influence`), so the attacker weighs like one honest
trainer. The honest clients' weights hashes are identical at every applied step, no loss is
NaN or infinite, and the held-out loss after the run is within 5% of a clean run's (same
settings, four honest clients, measured in the same session).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from psyche_client.distro.result import DistroResult, ResultLayout
from psyche_client.distro.values import ValueKind

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import client_id, run_attack
from tests.e2e.conftest import ATTACK_TEST_STEPS, CleanRun

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # a clean run and an attacked one

LOSS_TOLERANCE = 0.05


def largest_value(path: Path) -> float:
    """The largest |value| in a result file the attacker wrote (decoded strictly against the
    layout of `builtin:llama-tiny` with the tests' DisTrO settings and bf16 values)."""
    import torch
    from psyche_client.training.model.loading import load_model

    model, _ = load_model("builtin:llama-tiny", device="cpu", dtype=torch.float32)
    layout = ResultLayout.for_parameters(
        ((name, tuple(p.shape)) for name, p in model.named_parameters()), 64, 8, ValueKind.BF16
    )
    result = DistroResult.decode(path.read_bytes(), layout)
    return max(float(np.abs(t.values(ValueKind.BF16)).max()) for t in result.tensors)


def test_huge_values_weigh_like_one_trainer(tmp_path: Path, clean_run: CleanRun) -> None:
    attack = ATTACKS["huge"]
    clean = clean_run(attack.quantize_1bit, attack.verification_percent)
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=ATTACK_TEST_STEPS)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= ATTACK_TEST_STEPS - 4, run.diagnostics
    assert run.losses_finite
    bad = client_id(run.attackers[0])
    applied = [e for p in run.honest for e in p.events("applied step") if bad in e["senders"]]
    assert applied, "no honest client applied a result of the huge-values trainer"
    sent = sorted((tmp_path / "attacker-results").glob("result-*.bin"))
    assert sent and largest_value(sent[0]) > 1e20, "the attacker sent no huge values"
    assert clean.eval_loss is not None and run.eval_loss is not None
    assert math.isfinite(run.eval_loss)
    ratio = run.eval_loss / clean.eval_loss
    print(f"eval loss: clean {clean.eval_loss:.4f}, attacked {run.eval_loss:.4f} ({ratio:.4f})")
    assert abs(ratio - 1.0) <= LOSS_TOLERANCE, (clean.eval_loss, run.eval_loss)
