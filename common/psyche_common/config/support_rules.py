"""What a config may ask that this project's client cannot do (the reference's can):

- a `Gcs` checkpoint: the client loads models from a local directory, a `builtin:` preset or
  the Hugging Face Hub, never from Google Cloud Storage (an error; a `P2PGcs` checkpoint only
  warns, since members fetch the weights from each other and only a run with no member
  holding them falls back to the bucket);
- `architecture = "Torchtitan"`: the client builds every model with transformers from its
  `config.json` and takes Torchtitan as HfAuto (a warning; the other architectures are
  checked against the model by `architecture_rules`);
- `repo_id = "builtin:NAME"` for a preset the client does not ship (an error).
"""

from __future__ import annotations

from psyche_common.config.builtin_models import BUILTIN_MODEL_PREFIX, BUILTIN_MODELS
from psyche_common.config.checkpoint import GcsCheckpoint, P2PGcsCheckpoint
from psyche_common.config.enums import Architecture
from psyche_common.config.errors import ConfigProblem
from psyche_common.config.state_file import StateFile

_LLM = "model.LLM"


def support_problems(state: StateFile) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings): what the client cannot load or does not use."""
    model = state.model
    errors: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    checkpoint = model.checkpoint
    field = f"{_LLM}.checkpoint.{checkpoint.kind}"
    if isinstance(checkpoint, GcsCheckpoint) and checkpoint.bucket:  # empty: model_rules
        errors.append(
            ConfigProblem(
                field,
                f"{field} ({checkpoint}): the client cannot load a model from Google Cloud "
                "Storage; use a Hub checkpoint (a Hub repo id, a local directory written as a "
                "path, or builtin:NAME)",
                "ModelCheck",
            )
        )
    elif isinstance(checkpoint, P2PGcsCheckpoint) and checkpoint.bucket:
        warnings.append(
            ConfigProblem(
                field,
                f"{field} ({checkpoint}): members share the weights with each other, but a "
                "client that finds no member holding them cannot fall back to Google Cloud "
                "Storage (the client has no GCS support)",
                "ModelCheck",
            )
        )
    repo = checkpoint.hub_repo()
    if repo is not None and repo.repo_id.startswith(BUILTIN_MODEL_PREFIX):
        name = repo.repo_id.removeprefix(BUILTIN_MODEL_PREFIX)
        if name not in BUILTIN_MODELS:
            errors.append(
                ConfigProblem(
                    f"{field}.repo_id",
                    f"{field}.repo_id {repo.repo_id!r} is not a model preset of the client "
                    f"(known: {', '.join(BUILTIN_MODEL_PREFIX + n for n in BUILTIN_MODELS)})",
                    "ModelCheck",
                )
            )
    if model.architecture == Architecture.TORCHTITAN:
        warnings.append(
            ConfigProblem(
                f"{_LLM}.architecture",
                f'{_LLM}.architecture "Torchtitan" is not used by this client: it builds every '
                "model with transformers from the checkpoint's config.json (as HfAuto would), "
                "so the model must be in Hugging Face format",
                "ModelCheck",
            )
        )
    return errors, warnings
