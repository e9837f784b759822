"""A short human-readable description of a run configuration (used by `validate-config`)."""

from __future__ import annotations

from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.lr_schedule import ConstantLR, CosineLR, LinearLR
from psyche_common.config.state_file import StateFile


def _lr_text(state: StateFile) -> str:
    schedule = state.model.lr_schedule
    if isinstance(schedule, CosineLR | LinearLR):
        return (
            f"{schedule.kind} {schedule.base_lr:g} -> {schedule.final_lr:g} "
            f"(warmup {schedule.warmup_steps} steps, until step {schedule.total_steps})"
        )
    if isinstance(schedule, ConstantLR):
        return f"Constant {schedule.base_lr:g} (warmup {schedule.warmup_steps} steps)"
    return (
        f"WarmupStableDecay {schedule.base_lr:g} (warmup {schedule.warmup_steps}, "
        f"stable {schedule.stable_steps}, cosine {schedule.cosine_decay_steps}, "
        f"linear {schedule.linear_decay_steps} steps)"
    )


def _checkpoint_text(state: StateFile) -> str:
    checkpoint = state.model.checkpoint
    text = str(checkpoint)
    # P2P variants already name themselves ("P2P - Hub repo: …"); others show a bare repo
    return (
        text if text == checkpoint.kind or text.startswith("P2P") else f"{checkpoint.kind} {text}"
    )


def _batch_text(state: StateFile) -> str:
    cfg = state.config
    seq = state.model.max_seq_len
    start, end = cfg.global_batch_size_start, cfg.global_batch_size_end
    if start == end or cfg.global_batch_size_warmup_tokens == 0:
        return f"{end} samples x {seq} tokens = {end * seq:,} tokens per step"
    return (
        f"{start} -> {end} samples of {seq} tokens, "
        f"ramped over {cfg.global_batch_size_warmup_tokens:,} tokens"
    )


def summary_lines(state: StateFile, data_config: DataServerConfig | None = None) -> list[str]:
    """`label: value` lines describing the run (identity, model, data, optimizer, schedule)."""
    cfg, model = state.config, state.model
    witnesses = "all clients (max 32)" if cfg.witness_nodes == 0 else str(cfg.witness_nodes)
    rows = [
        ("run id", state.run_id),
        ("model", f"{model.architecture.value}, max_seq_len {model.max_seq_len}"),
        ("checkpoint", _checkpoint_text(state)),
        ("data", f"{model.data_location} ({model.data_type.value})"),
        ("optimizer", str(model.optimizer)),
        ("lr schedule", _lr_text(state)),
        ("total steps", f"{cfg.total_steps} (now at step {state.progress.step})"),
        ("batch size", _batch_text(state)),
        (
            "clients",
            f"{cfg.init_min_clients} to start an epoch, {cfg.min_clients} to keep it going, "
            f"witnesses per round: {witnesses}",
        ),
        (
            "timings",
            f"epoch {cfg.epoch_time} s, warmup <= {cfg.warmup_time} s, "
            f"round train <= {cfg.max_round_train_time} s, witness {cfg.round_witness_time} s, "
            f"cooldown {cfg.cooldown_time} s",
        ),
    ]
    if data_config is not None:
        rows.append(
            (
                "data server",
                f"{data_config.dir} ({data_config.token_size.value}, "
                f"seq_len {data_config.seq_len})",
            )
        )
    width = max(len(label) for label, _ in rows)
    return [f"{label + ':':<{width + 1}} {value}" for label, value in rows]
