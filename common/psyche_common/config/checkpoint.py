"""Checkpoint variants (`model.LLM.checkpoint`): where clients get the model weights.

TOML forms: `checkpoint = "Ephemeral"`, or a section `[model.LLM.checkpoint.Hub]` (also `Dummy`,
`P2P`) with `repo_id` and optional `revision`, or `[model.LLM.checkpoint.Gcs]` (also `P2PGcs`)
with `bucket` and optional `prefix`.

Callers ask a checkpoint what it means (`is_p2p`, `hub_repo()`) rather than testing its `kind`
string or probing for fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

from psyche_common.config._types import ShortStr, StrictModel
from psyche_common.config.tagged import Variant, toml_tagged


class HubRepo(StrictModel):
    """A Hugging Face repository (or, in this project, a local directory or `builtin:NAME`)."""

    repo_id: ShortStr
    revision: ShortStr | None = None


class GcsRepo(StrictModel):
    """A Google Cloud Storage location."""

    bucket: ShortStr
    prefix: ShortStr | None = None


class _CheckpointVariant(Variant):
    """What every checkpoint variant answers."""

    @property
    def is_p2p(self) -> bool:
        """Whether clients fetch the weights from the epoch's peers (P2P, P2PGcs); the stored
        repository is only the fallback then."""
        return False

    def hub_repo(self) -> HubRepo | None:
        """The Hub repository (or local directory, or `builtin:NAME`) that names the model, for
        Hub, Dummy and P2P; None for a checkpoint that names none (Ephemeral, Gcs, P2PGcs)."""
        return None


class _HubCheckpoint(_CheckpointVariant):
    repo_id: ShortStr
    """A Hub repository, or in this project a local directory written as a path or
    `builtin:NAME`; not empty (but for Dummy)."""
    revision: ShortStr | None = None
    """The Hub revision (branch, tag or commit); left out: the default branch."""

    @property
    def repo(self) -> HubRepo:
        return HubRepo(repo_id=self.repo_id, revision=self.revision)

    def hub_repo(self) -> HubRepo:
        return self.repo


class _GcsCheckpoint(_CheckpointVariant):
    bucket: ShortStr
    """The Google Cloud Storage bucket; not empty."""
    prefix: ShortStr | None = None
    """The folder of the checkpoint in the bucket; left out: its top level."""

    @property
    def repo(self) -> GcsRepo:
        return GcsRepo(bucket=self.bucket, prefix=self.prefix)

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"


class EphemeralCheckpoint(_CheckpointVariant):
    """No checkpoint at all; clients cannot start from it (invalid for a run)."""

    kind: Literal["Ephemeral"] = "Ephemeral"

    def __str__(self) -> str:
        return "Ephemeral"


class DummyCheckpoint(_HubCheckpoint):
    """Clients build a model without downloading weights."""

    kind: Literal["Dummy"] = "Dummy"

    def __str__(self) -> str:
        return "Dummy"


class HubCheckpoint(_HubCheckpoint):
    """Download from the Hub (repo_id may also be a local directory or `builtin:NAME`)."""

    kind: Literal["Hub"] = "Hub"

    def __str__(self) -> str:
        return self.repo_id


class P2PCheckpoint(_HubCheckpoint):
    """Fetch the weights from peers of the epoch; `repo_id` is the Hub fallback."""

    kind: Literal["P2P"] = "P2P"

    @property
    def is_p2p(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"P2P - Hub repo: {self.repo_id}"


class GcsCheckpoint(_GcsCheckpoint):
    """Download from Google Cloud Storage."""

    kind: Literal["Gcs"] = "Gcs"


class P2PGcsCheckpoint(_GcsCheckpoint):
    """Fetch the weights from peers; the GCS location is the fallback."""

    kind: Literal["P2PGcs"] = "P2PGcs"

    @property
    def is_p2p(self) -> bool:
        return True


CHECKPOINT_VARIANTS = (
    EphemeralCheckpoint,
    DummyCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    GcsCheckpoint,
    P2PGcsCheckpoint,
)
"""All checkpoint classes, in the reference's wire (postcard) index order."""

AnyCheckpoint = (
    EphemeralCheckpoint
    | DummyCheckpoint
    | HubCheckpoint
    | P2PCheckpoint
    | GcsCheckpoint
    | P2PGcsCheckpoint
)
"""Plain union of the checkpoint classes, for type hints."""

Checkpoint = Annotated[AnyCheckpoint, *toml_tagged("checkpoint", *CHECKPOINT_VARIANTS)]
"""`AnyCheckpoint` read from and written to its TOML form (use it as a pydantic field type)."""
