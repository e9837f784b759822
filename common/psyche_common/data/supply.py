"""Does a run's data last the run? How many samples it needs and how many its data holds.

`samples_needed(state)` is the data cursor the run reaches at its last step: the coordinator
hands out `data_index .. data_index + batch - 1` per round, the batch following the ramp
(`get_batch_size`), from `progress.epoch_start_data_index` until `config.total_steps`.
`samples_held(...)` counts the full `seq_len` sequences of token files that can be sized
from here: the data server's data.toml (`Server` locations) and `Local` directories or
data.toml files (None for anything else: HTTP, builtin corpora, dummy data, or a path that
does not exist on this machine). `supply_warning` turns both into a `validate-config`
warning naming the two numbers (a warning: the reference's example configs ship with sample
data far smaller than their runs). `data_files_problem` warns when the data server's folder
exists but holds no token file at its top level (only those are read), which `run` refuses.
"""

from __future__ import annotations

from pathlib import Path

from psyche_common.config.data_location import LocalData, ServerData
from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.enums import TokenSize
from psyche_common.config.errors import ConfigError, ConfigProblem
from psyche_common.config.loading import load_data_config
from psyche_common.config.state_file import StateFile
from psyche_common.coordinator.assignment import get_batch_size
from psyche_common.data.errors import DataError
from psyche_common.data.token_files import list_token_files, open_token_file, recorded_token_size

MAX_RAMP_ROUNDS = 10_000_000
"""Rounds of a batch-size ramp walked one by one before giving up on an exact count."""


def samples_needed(state: StateFile) -> int | None:
    """The data index after the run's last round (None: a ramp too long to walk)."""
    cfg = state.config
    index = state.progress.epoch_start_data_index
    rounds = max(0, cfg.total_steps - state.progress.step)
    seq_len = state.model.max_seq_len
    walked = 0
    while rounds and index * seq_len < cfg.global_batch_size_warmup_tokens:
        if walked >= MAX_RAMP_ROUNDS:
            return None
        index += get_batch_size(cfg, index * seq_len)
        rounds -= 1
        walked += 1
    return index + rounds * get_batch_size(cfg, index * seq_len)


def count_sequences(directory: Path, token_size: TokenSize, seq_len: int) -> int:
    """Full `seq_len` sequences in the token files of `directory` (raises DataError)."""
    files = list_token_files(directory)
    return sum(len(open_token_file(path, token_size)) // seq_len for path in files)


def samples_held(state: StateFile, data_config: DataServerConfig | None) -> tuple[int, str] | None:
    """(sequences, where) of the run's data when it can be sized from here, else None."""
    location = state.model.data_location
    seq_len = state.model.max_seq_len
    try:
        if isinstance(location, ServerData) and data_config is not None:
            count = count_sequences(data_config.dir, data_config.token_size, seq_len)
            return count, f"the data server's {data_config.dir}"
        if isinstance(location, LocalData) and location.path:
            path = Path(location.path).expanduser()
            if path.is_file() and path.suffix == ".toml":
                config = load_data_config(path)
                return count_sequences(config.dir, config.token_size, seq_len), str(config.dir)
            if path.is_dir():
                return count_sequences(path, TokenSize(recorded_token_size(path)), seq_len), str(
                    path
                )
    except (ConfigError, DataError, OSError, ValueError):
        return None  # unreadable data is reported elsewhere (data_dir_problem, the server)
    return None


def data_files_problem(data_config: DataServerConfig) -> ConfigProblem | None:
    """A warning when data.toml's existing `dir` has no token file at its top level."""
    directory = data_config.dir
    if not directory.is_dir():
        return None  # validation's data_dir_problem says so
    try:
        list_token_files(directory)
    except DataError as exc:
        subdirectories = sorted(p.name for p in directory.iterdir() if p.is_dir())
        found = f" (it holds the folders {', '.join(subdirectories)})" if subdirectories else ""
        return ConfigProblem(
            "data.dir",
            f"{exc}{found}: only the top-level files of data.toml's dir are read, and "
            "`psyche-server run` cannot start the data server without one",
            "DataDir",
        )
    return None


def supply_warning(state: StateFile, data_config: DataServerConfig | None) -> ConfigProblem | None:
    """A warning when the run needs more samples than its (sizable) data holds."""
    held = samples_held(state, data_config)
    if held is None:
        return None
    count, where = held
    needed = samples_needed(state)
    if needed is None or needed <= count:
        return None
    cfg = state.config
    return ConfigProblem(
        "config.total_steps",
        f"the run needs {needed:,} samples of {state.model.max_seq_len} tokens "
        f"(config.total_steps {cfg.total_steps} from step {state.progress.step}, "
        f"{cfg.global_batch_size_end} samples per step) but {where} holds {count:,}: the run "
        "ends when the data runs out",
        "DataSupply",
    )
