"""What each `model.LLM.architecture` trains, checked against the model's `config.json`.

The client builds every model with transformers' own class for the config's `model_type`
(`AutoModelForCausalLM`), so the architecture is a declaration that is checked, not a choice
of implementation:

* `HfLlama`: `model_type` "llama" only (Llama 2 and 3, and Llama-3.2 and SmolLM2 with their
  tied embeddings), the models the reference builds with its own Llama implementation;
* `HfDeepseek`: "deepseek_v3" or "deepseek_v2" (multi-head latent attention, mixture of
  experts), the reference's DeepSeek implementation;
* `HfAuto`: any causal LM that transformers builds from its config without remote code
  (Qwen2, Gemma2, Mistral, Phi-3, GPT-NeoX, ...); the client refuses, when it loads the
  model, a `model_type` that transformers does not know as a causal LM;
* `Torchtitan`: taken as `HfAuto` (this client has no TorchTitan models; `support_rules`
  warns that the model must be in Hugging Face format).

Tied input and output embeddings are supported under every architecture.

`architecture_problems` runs in `validate-config` (and so when the server starts) on the
`config.json` of a checkpoint that names a local directory, when that directory exists on
this machine (a Hub repo or a `builtin:` preset is checked by the
client, which runs `model_config_problem` on every model config before it builds the model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from psyche_common.config.enums import Architecture
from psyche_common.config.errors import ConfigProblem
from psyche_common.config.state_file import StateFile
from psyche_common.model_source import SourceKind, classify_source

_FIELD = "model.LLM.architecture"
_RULE = "Architecture"

# The `model_type`s an architecture that names one family accepts (HfAuto and Torchtitan
# accept any).
MODEL_TYPES: dict[Architecture, tuple[str, ...]] = {
    Architecture.HF_LLAMA: ("llama",),
    Architecture.HF_DEEPSEEK: ("deepseek_v3", "deepseek_v2"),
}


def model_config_problem(
    architecture: Architecture, model_config: Mapping[str, object], source: str
) -> ConfigProblem | None:
    """The error of a model (its config.json dict, from `source`) that `architecture` does
    not train; None when it does (as far as the config alone tells)."""
    model_type = model_config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return ConfigProblem(
            _FIELD,
            f"the config.json of model {source} has no model_type: the model family is unknown",
            _RULE,
        )
    accepted = MODEL_TYPES.get(architecture)
    if accepted is None or model_type in accepted:
        return None
    names = " or ".join(repr(t) for t in accepted)
    suggestion = next((a for a, types in MODEL_TYPES.items() if model_type in types), None)
    instead = (suggestion or Architecture.HF_AUTO).value
    return ConfigProblem(
        _FIELD,
        f'{_FIELD} "{architecture.value}" trains model_type {names}, but model {source} is '
        f'{model_type!r} (config.json model_type): set architecture = "{instead}"',
        _RULE,
    )


def _local_directory(state: StateFile) -> tuple[str, Path] | None:
    repo = state.model.checkpoint.hub_repo()
    if repo is None or not repo.repo_id or classify_source(repo.repo_id) != SourceKind.LOCAL:
        return None
    return repo.repo_id, Path(repo.repo_id).expanduser()


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name the file system cannot hold (a NUL byte)
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def architecture_problems(state: StateFile) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings) of `model.LLM.architecture` against the run's model, as far as this
    machine can see it (see the module docstring)."""
    local = _local_directory(state)
    if local is None:
        return [], []
    source, directory = local
    field = f"model.LLM.checkpoint.{state.model.checkpoint.kind}.repo_id"
    config_path = directory / "config.json"
    if not _is_file(config_path):
        what = "has no config.json" if _is_dir(directory) else "does not exist on this machine"
        return [], [
            ConfigProblem(
                field,
                f"{field}: the local model directory {source} {what}; its architecture is "
                "checked by each client when it loads the model",
                _RULE,
            )
        ]
    try:
        model_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [ConfigProblem(field, f"{field}: cannot read {config_path}: {exc}", _RULE)], []
    if not isinstance(model_config, dict):
        return [ConfigProblem(field, f"{field}: {config_path} is not a JSON object", _RULE)], []
    problem = model_config_problem(state.model.architecture, model_config, source)
    return ([problem] if problem is not None else []), []
