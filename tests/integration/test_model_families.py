"""Every model family a run trains, tied embeddings included, through the real backend.

For each tiny family (`tests.support.model_families`): two `DistroBackend` clients load the
model from a local directory under the family's `model.LLM.architecture`, train three steps
on their own batches, apply each other's results (in different orders) and keep identical
weights hashes; a late joiner built from the shared config takes their exported parameters;
a verifier's recompute covers every parameter; and the checkpoint one of them writes (and one
in the multi-device client's layout) loads in transformers with equal weights and, for a tied
model, the tie intact. A tied embedding is one
tensor everywhere: one result tensor, one hash entry, one exported parameter, one tensor in
the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from psyche_client.training.backend import shared_config_json
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.training.model.checkpoint import save_state_checkpoint
from psyche_client.training.trainer import weights_digest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, RunState
from safetensors import safe_open
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.support.coordinators import coordinator_in, distro_model, ids
from tests.support.model_families import FAMILIES, Family, short_directory, write_family

SEQ_LEN = 16


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with short_directory() as directory:
        yield directory


def warmup(directory: Path, architecture: str) -> Coordinator:
    llm = distro_model(str(directory), chunk=16, topk=4, max_seq_len=SEQ_LEN)
    return coordinator_in(RunState.Warmup, ids(2), model=llm | {"architecture": architecture})


def is_tied(model: torch.nn.Module) -> bool:
    assert isinstance(model, PreTrainedModel)
    output = model.get_output_embeddings()
    return output is not None and output.weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_trains_with_identical_hashes_and_reloads(family: Family, short_tmp: Path) -> None:
    torch.set_num_threads(1)
    coordinator = warmup(write_family(short_tmp / "model", family), family.architecture)
    a = DistroBackend.load(coordinator, device="cpu", micro_batch_size=2)
    b = DistroBackend.load(coordinator, device="cpu", micro_batch_size=2)
    model = a.trainer.model
    assert is_tied(model) == family.tied
    distinct = {id(p) for p in model.parameters()}
    assert len(a.trainer.layout.tensors) == len(distinct)  # a tied tensor is compressed once
    assert a.weights_hash() == b.weights_hash()
    rng = np.random.default_rng(0)
    previous = a.weights_hash()
    for step in (1, 2, 3):
        trained = []
        for index, backend in enumerate((a, b)):
            batch = BatchId(10 * step + 2 * index, 10 * step + 2 * index + 1)
            out = backend.train(step, batch, rng.integers(0, 256, (2, SEQ_LEN)), lambda: False)
            assert out is not None and np.isfinite(out.loss)
            trained.append((batch, out))
        for backend, order in ((a, trained), (b, trained[::-1])):
            backend.apply(
                step, [backend.decode(step, bt, o.payload, o.data_hash) for bt, o in order]
            )
        assert a.weights_hash() == b.weights_hash() != previous
        previous = a.weights_hash()
    assert is_tied(a.trainer.model) == family.tied  # training and applying kept the tie

    exported = a.export_parameters()
    assert len(exported) == len(distinct)
    joiner = DistroBackend.load(
        coordinator,
        device="cpu",
        micro_batch_size=2,
        peer_config=json.loads(shared_config_json(a.capabilities)),
    )
    joiner.load_parameters({name: data for name, _, _, data in exported})
    assert joiner.weights_hash() == a.weights_hash()
    assert is_tied(joiner.trainer.model) == family.tied

    reference = a.recompute(rng.integers(0, 256, (2, SEQ_LEN)))
    assert isinstance(reference, list) and len(reference) == len(a.trainer.layout.tensors)

    checkpoint = short_tmp / "checkpoint"
    a.save_checkpoint(str(checkpoint))
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as saved:
        stored = set(saved.keys())
    if family.tied:  # one tensor per parameter (transformers may rename some, GPT-NeoX's head)
        assert len(stored) == len(exported)
    embedding = model.get_input_embeddings().weight
    aliases = {n for n, p in model.named_parameters(remove_duplicate=False) if p is embedding}
    assert len(aliases) == (2 if family.tied else 1)
    assert len(aliases & stored) == 1  # a tied embedding is stored once
    reloaded = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    assert weights_digest(reloaded) == a.weights_hash()
    assert is_tied(reloaded) == family.tied

    # the layout a multi-device client writes: a state dict of the parameters, each once
    state = {name: p.detach() for name, p in model.named_parameters()}
    written = save_state_checkpoint(state, model.config, short_tmp / "state-checkpoint")
    reloaded = AutoModelForCausalLM.from_pretrained(str(written))
    assert weights_digest(reloaded) == a.weights_hash()
    assert is_tied(reloaded) == family.tied
