"""Configuration of a run: pydantic models of `state.toml` and `data.toml`, loading, validation.

Public names are re-exported here; import them from `psyche_common.config`.
"""

from psyche_common.config._types import seconds_to_ms
from psyche_common.config.checkpoint import (
    CHECKPOINT_VARIANTS,
    AnyCheckpoint,
    Checkpoint,
    DummyCheckpoint,
    EphemeralCheckpoint,
    GcsCheckpoint,
    GcsRepo,
    HubCheckpoint,
    HubRepo,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.config.coordinator_config import CoordinatorConfig
from psyche_common.config.coordinator_rules import (
    coordinator_config_problem,
    validate_coordinator_config,
)
from psyche_common.config.data_location import (
    AnyDataLocation,
    AnyHttpLocation,
    AnyShuffle,
    BuiltinData,
    DataLocation,
    DontShuffle,
    DummyData,
    Gcp,
    HttpData,
    LocalData,
    NumberedFiles,
    PreprocessedData,
    SeededShuffle,
    ServerData,
    SingleUrl,
    WeightedHttpData,
)
from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.enums import Architecture, DataType, TokenSize
from psyche_common.config.epoch_state import EpochStateTable
from psyche_common.config.errors import ConfigError, ConfigProblem
from psyche_common.config.loading import (
    load_data_config,
    load_state,
    parse_data_config,
    parse_state,
    read_toml,
)
from psyche_common.config.lr_schedule import (
    AnyLRSchedule,
    ConstantLR,
    CosineLR,
    LinearLR,
    LRSchedule,
    WarmupStableDecayLR,
)
from psyche_common.config.model import LLMConfig
from psyche_common.config.optimizer import (
    AdamWOptimizer,
    AnyOptimizer,
    DistroOptimizer,
    DummyOptimizer,
    Optimizer,
    SparseLocoOptimizer,
)
from psyche_common.config.state_file import StateFile, StateFileProgress
from psyche_common.config.summary import summary_lines
from psyche_common.config.validation import (
    BUILTIN_DATASETS,
    ValidationReport,
    check_state,
    data_dir_problem,
    require_data_dir,
    validate_state,
)
from psyche_common.config.verification_table import VerificationTable

__all__ = [
    "BUILTIN_DATASETS",
    "CHECKPOINT_VARIANTS",
    "AdamWOptimizer",
    "AnyCheckpoint",
    "AnyDataLocation",
    "AnyHttpLocation",
    "AnyLRSchedule",
    "AnyOptimizer",
    "AnyShuffle",
    "Architecture",
    "BuiltinData",
    "Checkpoint",
    "ConfigError",
    "ConfigProblem",
    "ConstantLR",
    "CoordinatorConfig",
    "CosineLR",
    "DataLocation",
    "DataServerConfig",
    "DataType",
    "DistroOptimizer",
    "DontShuffle",
    "DummyCheckpoint",
    "DummyData",
    "DummyOptimizer",
    "EphemeralCheckpoint",
    "EpochStateTable",
    "Gcp",
    "GcsCheckpoint",
    "GcsRepo",
    "HttpData",
    "HubCheckpoint",
    "HubRepo",
    "LLMConfig",
    "LRSchedule",
    "LinearLR",
    "LocalData",
    "NumberedFiles",
    "Optimizer",
    "P2PCheckpoint",
    "P2PGcsCheckpoint",
    "PreprocessedData",
    "SeededShuffle",
    "ServerData",
    "SingleUrl",
    "SparseLocoOptimizer",
    "StateFile",
    "StateFileProgress",
    "TokenSize",
    "ValidationReport",
    "VerificationTable",
    "WarmupStableDecayLR",
    "WeightedHttpData",
    "check_state",
    "coordinator_config_problem",
    "data_dir_problem",
    "load_data_config",
    "load_state",
    "parse_data_config",
    "parse_state",
    "read_toml",
    "require_data_dir",
    "seconds_to_ms",
    "summary_lines",
    "validate_coordinator_config",
    "validate_state",
]
