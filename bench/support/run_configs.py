"""Run configurations the benches and the tests build coordinators from: the base
`[config]` and `[model.LLM]` tables of a small test run (`BASE_CONFIG`, `BASE_MODEL`), a DisTrO
run's model overrides (`distro_model`), and a `Coordinator` waiting for members
(`make_coordinator`). tests/support/coordinators.py brings one to any run state."""

from __future__ import annotations

from typing import Any

from psyche_common.config import CoordinatorConfig, LLMConfig
from psyche_common.coordinator import Coordinator, RunState

BASE_CONFIG: dict[str, Any] = {
    "warmup_time": 5,
    "cooldown_time": 5,
    "max_round_train_time": 5,
    "round_witness_time": 2,
    "global_batch_size_warmup_tokens": 0,
    "epoch_time": 60,
    "total_steps": 100,
    "init_min_clients": 2,
    "min_clients": 2,
    "witness_nodes": 1,
    "global_batch_size_start": 4,
    "global_batch_size_end": 4,
    "verification_percent": 0,
    "waiting_for_members_extra_time": 3,
}

BASE_MODEL: dict[str, Any] = {
    "max_seq_len": 512,
    "cold_start_warmup_steps": 0,
    "architecture": "HfLlama",
    "checkpoint": {"Hub": {"repo_id": "builtin:llama-tiny"}},
    "data_type": "Pretraining",
    "data_location": "Dummy",
    "lr_schedule": {"Constant": {"base_lr": 1e-3, "warmup_init_lr": 0.0, "warmup_steps": 1}},
    "optimizer": "Dummy",
}


def distro_model(
    repo_id: str = "builtin:llama-tiny",
    *,
    chunk: int,
    topk: int,
    quantize_1bit: bool = True,
    max_seq_len: int = 16,
) -> dict[str, Any]:
    """`[model.LLM]` overrides for a DisTrO run of the Hub model `repo_id` at a constant lr
    of 3e-3 (gradients clipped to norm 1)."""
    return {
        "checkpoint": {"Hub": {"repo_id": repo_id}},
        "max_seq_len": max_seq_len,
        "lr_schedule": {"Constant": {"base_lr": 3e-3, "warmup_init_lr": 0.0, "warmup_steps": 0}},
        "optimizer": {
            "Distro": {
                "compression_chunk": chunk,
                "compression_topk": topk,
                "quantize_1bit": quantize_1bit,
                "compression_decay": 0.999,
                "clip_grad_norm": 1.0,
            }
        },
    }


def make_config(**overrides: Any) -> CoordinatorConfig:
    return CoordinatorConfig.model_validate({**BASE_CONFIG, **overrides})


def make_model(**overrides: Any) -> LLMConfig:
    return LLMConfig.model_validate({**BASE_MODEL, **overrides})


def make_coordinator(model: dict[str, Any] | None = None, **config: Any) -> Coordinator:
    return Coordinator(
        run_id="test",
        run_state=RunState.WaitingForMembers,
        model=make_model(**(model or {})),
        config=make_config(**config),
    )
