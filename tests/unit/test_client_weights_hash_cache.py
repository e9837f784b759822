"""`DistroBackend.weights_hash` is cached; the cache always equals a fresh full hash."""

from __future__ import annotations

import numpy as np
import torch
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.training.model.loading import weights_hash
from psyche_common.batch_id import BatchId

from tests.unit.test_client_distro_backend import make_coordinator


def fresh(backend: DistroBackend) -> bytes:
    return weights_hash(backend.trainer.model)


def test_cached_hash_follows_train_apply_and_load() -> None:
    torch.set_num_threads(1)
    backend = DistroBackend.load(make_coordinator(), device="cpu", micro_batch_size=2)
    initial = backend.weights_hash()
    assert initial == fresh(backend)
    rng = np.random.default_rng(3)
    for step in (1, 2):
        batch = BatchId(0, 1)
        output = backend.train(step, batch, rng.integers(0, 200, (2, 16)), lambda: False)
        assert output is not None
        assert backend.weights_hash() == fresh(backend)  # the lookahead restored the weights
        result = backend.decode(step, batch, output.payload, output.data_hash)
        backend.apply(step, [result])
        assert backend.weights_hash() == fresh(backend) != initial
    entries = backend.export_parameters()
    with torch.no_grad():
        for p in backend.trainer.model.parameters():
            p.zero_()
    backend.load_parameters({name: data for name, _, _, data in entries})
    assert backend.weights_hash() == fresh(backend)
