"""Which modules the sharded mode wraps as units: shared parameters stay inside one unit."""

from __future__ import annotations

import torch
from psyche_client.tools.estimate_parallel import unit_parameters
from psyche_client.training.model.loading import build_model_from_config
from psyche_client.training.parallel.units import fsdp_units
from transformers import PreTrainedModel

from tests.support.model_families import family


def build(name: str) -> PreTrainedModel:
    return build_model_from_config(family(name).build())


def test_untied_model_shards_every_layer_and_each_embedding_alone() -> None:
    model = build("llama")
    units = fsdp_units(model)
    assert all(len(unit) == 1 for unit in units)
    modules = [unit[0] for unit in units]
    assert list(model.model.layers) == modules[:2]
    assert modules[2:] == [model.get_input_embeddings(), model.get_output_embeddings()]


def test_tied_embeddings_are_one_unit_and_counted_once() -> None:
    model = build("qwen2-tied")
    units = fsdp_units(model)
    assert [len(unit) for unit in units] == [1, 1, 2]
    assert units[2] == [model.get_input_embeddings(), model.get_output_embeddings()]
    sizes, root = unit_parameters(model)
    embedding = model.get_input_embeddings().weight.numel()
    assert sizes[2] == embedding  # the shared tensor once
    assert root == model.model.norm.weight.numel()  # what no unit holds: the final norm


def test_a_unit_sharing_a_parameter_with_the_root_is_not_a_unit() -> None:
    """A parameter a unit shares with a module outside every unit must stay with the root."""
    model = build("llama")
    norm = model.model.norm
    shared = torch.nn.Parameter(torch.ones_like(norm.weight))
    norm.weight = shared
    model.model.layers[1].input_layernorm.weight = shared
    units = [unit[0] for unit in fsdp_units(model)]
    assert model.model.layers[1] not in units
    assert model.model.layers[0] in units
