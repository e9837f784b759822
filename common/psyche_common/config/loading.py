"""Reading state.toml and data.toml from disk into validated models (parsing only; the run
rules are in `psyche_common.config.validation`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.errors import ConfigError, ConfigProblem, problems_from_validation_error
from psyche_common.config.state_file import StateFile


def read_toml(path: Path | str) -> dict[str, Any]:
    """The TOML document at `path`; a missing file or a syntax error raises `ConfigError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigProblem("(file)", f"file not found: {path}")], path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem("(file)", f"cannot read {path}: {exc}")], path) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([ConfigProblem("(file)", f"not valid TOML: {exc}")], path) from exc


def parse_state(
    document: dict[str, Any], *, run_id: str | None = None, source: Path | str | None = None
) -> StateFile:
    """A `StateFile` from a TOML document. `run_id` replaces (or supplies) the file's run id, which
    lets the run-less `solana-test/*.toml` layouts be used."""
    document = dict(document)
    if run_id is not None:
        document["run_id"] = run_id
    elif "run_id" not in document:
        raise ConfigError(
            [
                ConfigProblem(
                    "run_id",
                    'run_id: missing; this file has no top-level `run_id = "..."` (config-only '
                    "layouts such as solana-test/*.toml leave it out): add it or pass --run-id",
                )
            ],
            source,
        )
    try:
        return StateFile.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation_error(exc), source) from None


def load_state(path: Path | str, *, run_id: str | None = None) -> StateFile:
    """Parse the state file at `path` (see `parse_state`); raises `ConfigError` naming each field."""
    return parse_state(read_toml(path), run_id=run_id, source=path)


def parse_data_config(
    document: dict[str, Any], *, base_dir: Path | str, source: Path | str | None = None
) -> DataServerConfig:
    """A `DataServerConfig` from a TOML document; a relative `dir` is resolved against `base_dir`."""
    try:
        config = DataServerConfig.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation_error(exc), source) from None
    if not config.dir.is_absolute():
        config = config.model_copy(update={"dir": (Path(base_dir) / config.dir).resolve()})
    return config


def load_data_config(path: Path | str) -> DataServerConfig:
    """Parse data.toml at `path`; a relative `dir` is resolved against data.toml's folder."""
    path = Path(path)
    return parse_data_config(read_toml(path), base_dir=path.resolve().parent, source=path)
