"""The exact encoded size of a result follows from the layout alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from psyche_client.distro import DistroOptimizer, DistroSettings
from psyche_client.distro.size import encoded_result_size
from psyche_common.batch_id import BatchId

from tests.support.tiny_distro import SETTINGS, TinyNet, set_random_grads


class Wide(torch.nn.Module):
    """Shapes whose varints take several bytes (dims and totalk >= 128)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(torch.zeros(300, 256))
        self.norm = torch.nn.Parameter(torch.zeros(200))


@pytest.mark.parametrize(
    "settings",
    [
        SETTINGS,
        dataclasses.replace(SETTINGS, quantize_1bit=True),
        dataclasses.replace(SETTINGS, quantize_2bit=True),
        DistroSettings(0.9, 8, 256, False),
        DistroSettings(0.9, 3, 200, True),
    ],
    ids=["bf16", "1bit", "2bit", "wide-bf16", "wide-1bit"],
)
@pytest.mark.parametrize("model_class", [TinyNet, Wide])
def test_every_encoded_result_has_the_layout_size(
    settings: DistroSettings, model_class: type[torch.nn.Module]
) -> None:
    model = model_class()
    optimizer = DistroOptimizer(model.named_parameters(), settings)
    expected = encoded_result_size(optimizer.layout)
    for seed, batch in ((1, BatchId(0, 0)), (2, BatchId(2**40, 2**41))):
        set_random_grads(model, seed)
        result = optimizer.generate(0.1, 2**31, batch, 2**32 - 1).transmit
        assert len(result.encode()) == expected
