"""The optimizer variants behind one interface: the registry finds each from a run config's
table or from built settings, the trainer drives every one the same way, and nothing in
`training/` asks which optimizer it holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from psyche_client.distro import DistroSettings
from psyche_client.distro.sparseloco import SparseLocoSettings
from psyche_client.training.optimizers.adamw import AdamWSettings
from psyche_client.training.optimizers.registry import (
    OPTIMIZERS,
    build_optimizer,
    optimizer_settings,
    optimizer_spec,
)
from psyche_common.config import AdamWOptimizer, DistroOptimizer, DummyOptimizer

from tests.support.tiny_distro import TinyNet

TRAINING = Path(__file__).resolve().parents[2] / "client" / "psyche_client" / "training"

DISTRO = DistroSettings(
    compression_decay=0.9, compression_topk=3, compression_chunk=4, quantize_1bit=True
)
SETTINGS = {
    "distro": DISTRO,
    "sparseloco": SparseLocoSettings(2, 1.0, 0.9, 3, 4),
    "adamw": AdamWSettings(),
}


def test_every_variant_is_registered_once_by_name() -> None:
    assert set(OPTIMIZERS) == set(SETTINGS)
    for name, spec in OPTIMIZERS.items():
        assert spec.name == name
    kinds = [spec.config_kind for spec in OPTIMIZERS.values() if spec.config_kind]
    assert len(kinds) == len(set(kinds))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_built_settings_find_their_variant_and_build_its_optimizer(name: str) -> None:
    settings = SETTINGS[name]
    assert optimizer_spec(settings).name == name
    assert optimizer_settings(settings) is settings
    params = sorted(TinyNet().named_parameters())
    optimizer = build_optimizer(settings, params)
    assert optimizer.name == name
    # only the compressed variants share results; only DisTrO's are verified by sign agreement
    assert (optimizer.shared is None) == (name == "adamw")
    assert (optimizer.verifier_compressor is None) == (name != "distro")


def test_run_config_tables_find_their_variant() -> None:
    distro = DistroOptimizer(
        compression_decay=0.9, compression_topk=3, compression_chunk=4, quantize_1bit=True
    )
    assert optimizer_spec(distro).name == "distro"
    assert optimizer_settings(distro) == DISTRO
    adamw = AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    assert optimizer_settings(adamw) == AdamWSettings((0.9, 0.95), 0.1, 1e-8, None)
    with pytest.raises(ValueError, match=r"unsupported optimizer.*need Distro, SparseLoCo, AdamW"):
        optimizer_spec(DummyOptimizer())
    with pytest.raises(ValueError, match="is not a distro optimizer"):
        OPTIMIZERS["distro"].settings_for(adamw)


def test_training_never_branches_on_optimizer_types() -> None:
    """The `Trainer` and the backends drive `TrainingOptimizer`; which variant a run has is
    the registry's business alone."""
    pattern = re.compile(r"isinstance\(.*(Optimizer|Settings)")
    found = [
        f"{path.relative_to(TRAINING)}:{number}: {line.strip()}"
        for path in sorted(TRAINING.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
